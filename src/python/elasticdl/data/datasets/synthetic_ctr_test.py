"""synthetic_ctr: deterministic by seed, records the project's reader and codec read, Zipf
skew, a hidden model whose AUC ceiling is recorded, and one-line errors for bad flags."""
import filecmp
import json
import os

import numpy as np
import pytest
from elasticdl.client.main import main as cli
from elasticdl.data.datasets import DatasetError, prepare, synthetic_ctr
from elasticdl.data.datasets.synthetic_ctr import NUM_DENSE, CtrParams, HiddenModel, auc
from elasticdl.data.example_codec import (
    decode_example_values,
    encode_example,
    float_feature,
    int64_feature,
)
from elasticdl.data.reader.factory import create_data_reader

SMALL = dict(rows=3000, features=5, vocab=1000, zipf=1.1, seed=7)


def _records(directory):
    reader = create_data_reader(str(directory))
    return [r for s in reader.create_shards() for r in reader.read_records(s.name, s.start, s.end)]


def _files(root):
    return sorted(
        os.path.relpath(os.path.join(d, f), root)
        for d, _, fs in os.walk(root)
        for f in fs
        if not f.startswith(".")
    )


def test_same_seed_same_bytes_other_seed_other_data(tmp_path):
    a = prepare("synthetic_ctr", str(tmp_path / "a"), progress=False, params=SMALL)
    b = prepare("synthetic_ctr", str(tmp_path / "b"), progress=False, params=SMALL)
    c = prepare("synthetic_ctr", str(tmp_path / "c"), progress=False, params={**SMALL, "seed": 8})
    assert c.metadata["test"]["auc_ceiling"] != a.metadata["test"]["auc_ceiling"]
    assert a.counts == {"train": 2700, "test": 300}
    assert (
        _files(tmp_path / "a")
        == _files(tmp_path / "b")
        == ["test/data-00000.rio", "train/data-00000.rio"]
    )
    for f in _files(tmp_path / "a"):
        assert filecmp.cmp(tmp_path / "a" / f, tmp_path / "b" / f, shallow=False)
    assert _records(tmp_path / "a" / "train") != _records(tmp_path / "c" / "train")
    assert a.metadata == b.metadata
    # Same parameters again: nothing to do.
    assert prepare("synthetic_ctr", str(tmp_path / "a"), progress=False, params=SMALL).skipped
    # Rows do not depend on how many are asked for: a longer dataset starts the same.
    d = prepare(
        "synthetic_ctr", str(tmp_path / "d"), progress=False, params={**SMALL, "rows": 4000}
    )
    assert d.counts == {"train": 3600, "test": 400}
    assert _records(tmp_path / "d" / "train")[:2700] == _records(tmp_path / "a" / "train")


def test_records_read_by_the_project_reader_and_codec(tmp_path):
    prepare("synthetic_ctr", str(tmp_path), progress=False, params=SMALL)
    records = _records(tmp_path / "train")
    assert len(records) == 2700
    labels = []
    for raw in records[:500]:
        values = decode_example_values(raw)
        assert sorted(values) == ["categorical", "dense", "label"]
        assert len(values["dense"]) == NUM_DENSE and min(values["dense"]) >= 0.0
        assert len(values["categorical"]) == 5
        assert all(0 <= i < 1000 for i in values["categorical"])
        assert values["label"] in ((0,), (1,))
        labels.append(values["label"][0])
        # Byte for byte what the project's own encoder writes for the same values.
        again = encode_example(
            {
                "dense": float_feature(values["dense"]),
                "categorical": int64_feature(values["categorical"]),
                "label": int64_feature(values["label"]),
            }
        )
        assert again == raw
    assert 0.1 < np.mean(labels) < 0.45  # calibrated to ~0.25


def test_large_ids_encode_like_the_codec():
    # Varints of every length up to the largest vocabulary (4 bytes for ids < 2**28).
    ids = np.array([[0, 127, 128, 16383], [16384, 2**21 - 1, 2**21, 10**8 - 1]], np.int64)
    dense = np.arange(2 * NUM_DENSE, dtype=np.float32).reshape(2, NUM_DENSE)
    labels = np.array([0, 1])
    got = list(synthetic_ctr.RecordEncoder(4).encode(ids, dense, labels))
    for i in range(2):
        want = encode_example(
            {
                "dense": float_feature(dense[i]),
                "categorical": int64_feature(ids[i]),
                "label": int64_feature([labels[i]]),
            }
        )
        assert got[i] == want


def test_ids_are_zipf_skewed():
    def top_share(zipf):
        model = HiddenModel(CtrParams(rows=100, features=1, vocab=10_000, zipf=zipf, seed=1))
        ids = next(model.rows(0, 65536))[0][:, 0]
        counts = np.sort(np.bincount(ids, minlength=10_000))[::-1]
        return counts[:100].sum() / counts.sum()  # share of the 1% most frequent ids

    # Zipf 1.2 over 10^4 ids: the top 1% of ids should carry ~72% of the draws.
    skewed, uniform = top_share(1.2), top_share(0.0)
    assert 0.65 < skewed < 0.8
    assert uniform < 0.03


def test_auc_ceiling_recorded_and_labels_follow_the_hidden_model(tmp_path):
    r = prepare("synthetic_ctr", str(tmp_path), progress=False, params=SMALL)
    with open(r.manifest) as f:
        md = json.load(f)["metadata"]["test"]
    assert md == r.metadata["test"]
    assert 0.6 < md["auc_ceiling"] < 1.0
    assert md["auc_rows"] == 300
    assert md["params"] == SMALL
    assert "auc_ceiling" in r.message
    # A model that knows nothing scores 0.5; the labels do follow the hidden probabilities.
    model = HiddenModel(CtrParams(**SMALL))
    _, _, prob, labels = next(model.rows(0, 65536))
    assert auc(prob, labels) > 0.7
    assert abs(auc(np.zeros(labels.size), labels) - 0.5) < 1e-9
    assert auc(np.array([0.1, 0.2, 0.3, 0.4]), np.array([0, 0, 1, 1])) == 1.0


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--rows", "5"], "--rows 5 is invalid: use 10 .. 10000000000 rows"),
        (["--vocab", "1000000000"], "--vocab 1000000000 is invalid: use 2 .. 100000000 ids"),
        (["--features", "0"], "--features 0 is invalid: use 1 .. 256 categorical features"),
        (["--zipf", "-1"], "--zipf -1.0 is invalid: use an exponent in [0, 5]"),
        (["--zipf", "nan"], "--zipf nan is invalid"),
        (["--seed", "-3"], "--seed -3 is invalid: use a non-negative integer"),
        (["--rows", "ten"], "argument --rows: invalid int value: 'ten'"),
    ],
)
def test_bad_flags_are_one_line_errors_and_write_nothing(tmp_path, capsys, flags, message):
    out = tmp_path / "out"
    rc = cli(["dataset", "prepare", "synthetic_ctr", "--output", str(out), *flags])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_parameters_only_for_generated_datasets(tmp_path, capsys):
    rc = cli(["dataset", "prepare", "census", "--output", str(tmp_path / "o"), "--vocab", "9"])
    assert rc == 2
    assert (
        "--vocab: census takes no parameters (they are for synthetic_ctr)"
        in capsys.readouterr().err
    )
    with pytest.raises(DatasetError, match="--source: synthetic_ctr is generated"):
        prepare("synthetic_ctr", str(tmp_path / "p"), source=str(tmp_path))
    with pytest.raises(DatasetError, match="--width: synthetic_ctr has no such parameter"):
        prepare("synthetic_ctr", str(tmp_path / "p"), params={"width": 3})
