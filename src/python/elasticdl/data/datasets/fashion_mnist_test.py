"""Full Fashion-MNIST preparation on the real data (Debian package, fetched into the cache)."""
import os

import numpy as np
import pytest
from elasticdl.data import recordio
from elasticdl.data.datasets import DatasetError, SourceUnavailableError, fashion_mnist, prepare
from elasticdl.data.example_codec import decode_example_values


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("fmnist")
    try:
        result = prepare("fashion_mnist", str(out), progress=False)
    except SourceUnavailableError as e:
        pytest.skip(f"Fashion-MNIST raw data unavailable here (apt?): {e}")
    return result


def _read_all(paths):
    return [r for p in paths for r in recordio.Scanner(p)]


def test_full_counts_shards_and_labels(prepared):
    assert prepared.counts == {"train": 60000, "test": 10000}
    assert not prepared.skipped
    assert len(prepared.files["train"]) == 15 and len(prepared.files["test"]) == 3
    assert [recordio.Index(p).num_records() for p in prepared.files["test"]] == [4096, 4096, 1808]
    test = [decode_example_values(r) for r in _read_all(prepared.files["test"])]
    labels = np.array([d["label"][0] for d in test])
    assert labels.min() == 0 and labels.max() == 9
    assert np.bincount(labels).tolist() == [1000] * 10  # Fashion-MNIST test set is balanced


def test_image_matches_idx_source(prepared):
    inputs = fashion_mnist.locate(None)
    images = fashion_mnist.read_idx(inputs.extra["paths"][("train", "images")], 3)
    labels = fashion_mnist.read_idx(inputs.extra["paths"][("train", "labels")], 1)
    first = prepared.files["train"][0]
    scanner = recordio.Scanner(first, start=1234, length=1)
    rec = decode_example_values(scanner.record())
    assert len(rec["image"]) == 1 and len(rec["image"][0]) == 784
    np.testing.assert_array_equal(
        np.frombuffer(rec["image"][0], np.uint8).reshape(28, 28), images[1234]
    )
    assert rec["label"] == (int(labels[1234]),)


def test_records_parse_with_tensorflow(prepared):
    import tensorflow as tf

    recs = list(recordio.Scanner(prepared.files["test"][0], 0, 8))
    parsed = tf.io.parse_example(
        recs,
        {
            "image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64),
        },
    )
    images = tf.reshape(tf.io.decode_raw(parsed["image"], tf.uint8), [-1, 28, 28])
    assert images.shape == (8, 28, 28)
    assert parsed["label"].dtype == tf.int64


def _tree_state(directory: str) -> dict:
    return {
        os.path.join(root, n): os.stat(os.path.join(root, n)).st_mtime_ns
        for root, _, names in os.walk(directory)
        for n in names
    }


def test_second_run_skips_the_conversion(prepared, monkeypatch):
    """A complete output with the same inputs: nothing decoded, nothing written. (How long the
    check takes is a benchmark: benchmarks/data/prepare_noop.py.)"""
    import elasticdl.data.datasets as datasets

    def must_not_run(*args, **kwargs):
        raise AssertionError("the second run converted the data again")

    monkeypatch.setattr(fashion_mnist, "read_idx", must_not_run)
    monkeypatch.setattr(datasets, "write_splits", must_not_run)
    before = _tree_state(prepared.output_dir)
    again = prepare("fashion_mnist", prepared.output_dir, progress=False)
    assert again.skipped and again.counts == prepared.counts
    assert again.files == prepared.files and again.input_sha256 == prepared.input_sha256
    assert "already prepared" in again.message
    assert _tree_state(prepared.output_dir) == before


def test_source_dir_and_bad_idx(tmp_path, prepared):
    src = os.path.dirname(fashion_mnist.locate(None).files[0])
    small = prepare(
        "fashion_mnist",
        str(tmp_path / "o"),
        source=src,
        limit=100,
        records_per_shard=64,
        progress=False,
    )
    assert small.counts == {"train": 100, "test": 100}
    assert [recordio.Index(p).num_records() for p in small.files["train"]] == [64, 36]
    with pytest.raises(SourceUnavailableError, match="missing train-images-idx3-ubyte.*--source"):
        prepare("fashion_mnist", str(tmp_path / "o2"), source=str(tmp_path))
    bad = tmp_path / "bad-idx"
    bad.write_bytes(b"\x00\x00\x0d\x03" + b"\x00" * 12)
    with pytest.raises(DatasetError, match="not a uint8 IDX file with 3 dimensions"):
        fashion_mnist.read_idx(str(bad), 3)


def test_original_schema_is_what_the_original_models_parse(tmp_path):
    # --schema original: `image` 784 floats 0..255, `label` int64 [1] (the original generators').
    import tensorflow as tf

    try:
        result = prepare(
            "fashion_mnist", str(tmp_path / "o"), progress=False, limit=64, schema="original"
        )
    except SourceUnavailableError as e:
        pytest.skip(f"Fashion-MNIST raw data unavailable here (apt?): {e}")
    inputs = fashion_mnist.locate(None)
    images = fashion_mnist.read_idx(inputs.extra["paths"][("test", "images")], 3)
    labels = fashion_mnist.read_idx(inputs.extra["paths"][("test", "labels")], 1)
    recs = list(recordio.Scanner(result.files["test"][0]))
    assert len(recs) == 64
    parsed = tf.io.parse_example(
        recs,
        {
            "image": tf.io.FixedLenFeature([28, 28], tf.float32),
            "label": tf.io.FixedLenFeature([1], tf.int64),
        },
    )
    np.testing.assert_array_equal(parsed["image"].numpy(), images[:64].astype(np.float32))
    np.testing.assert_array_equal(parsed["label"].numpy()[:, 0], labels[:64])
    # Not the default schema's output: its own identity, so a default run re-prepares.
    again = prepare("fashion_mnist", str(tmp_path / "o"), progress=False, limit=64)
    assert not again.skipped
    assert (
        len(decode_example_values(next(iter(recordio.Scanner(again.files["test"][0]))))["image"])
        == 1
    )


def test_unknown_schema_is_one_line(tmp_path):
    with pytest.raises(
        DatasetError, match="--schema 'v1' is invalid; use one of default, original"
    ):
        prepare("fashion_mnist", str(tmp_path / "x"), schema="v1")
