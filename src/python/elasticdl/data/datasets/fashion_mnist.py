"""Fashion-MNIST (Zalando, MIT/Expat licence): 60,000 train / 10,000 test 28x28 grey images.

Raw data: the IDX files of Debian's ``dataset-fashion-mnist`` package, or a directory given
with ``--source`` that holds ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte`` (each optionally ``.gz``).
The original order of the IDX files is kept.
"""
from __future__ import annotations

import gzip
import os
import struct
from typing import Dict, Iterator, Optional

import numpy as np
from elasticdl.data.datasets import sources
from elasticdl.data.datasets.errors import DatasetError, SourceUnavailableError
from elasticdl.data.datasets.spec import DatasetSpec, Inputs, Split
from elasticdl.data.example_codec import (
    bytes_feature,
    example_from_entries,
    feature_entry,
    int64_feature,
)

DEBIAN_PACKAGE = "dataset-fashion-mnist"
DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
FILES = {
    ("train", "images"): "train-images-idx3-ubyte",
    ("train", "labels"): "train-labels-idx1-ubyte",
    ("test", "images"): "t10k-images-idx3-ubyte",
    ("test", "labels"): "t10k-labels-idx1-ubyte",
}
_HINT = (
    "pass --source DIR holding the four Fashion-MNIST IDX files "
    "(train-images-idx3-ubyte.gz, ...), e.g. from `apt-get download dataset-fashion-mnist`"
)


def _find(directory: str, base: str) -> Optional[str]:
    for name in (base + ".gz", base):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return None


def locate(source: Optional[str]) -> Inputs:
    if source is not None:
        if not os.path.isdir(source):
            raise SourceUnavailableError(f"--source: {source!r} is not a directory; {_HINT}")
        directory = source
    else:
        directory = sources.debian_package_dir(DEBIAN_PACKAGE, DEBIAN_DIR, _HINT)
    paths = {}
    for key, base in FILES.items():
        path = _find(directory, base)
        if path is None:
            raise SourceUnavailableError(f"{directory}: missing {base}[.gz]; {_HINT}")
        paths[key] = path
    return Inputs(files=[paths[k] for k in FILES], extra={"paths": paths})


def read_idx(path: str, expected_ndim: int) -> np.ndarray:
    """An IDX array of unsigned bytes (magic 0x0000 08 <ndim>, big-endian dims)."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise DatasetError(f"{path}: cannot read IDX file: {e}") from e
    if len(data) < 4:
        raise DatasetError(f"{path}: not an IDX file (too short)")
    zero, dtype, ndim = struct.unpack_from(">HBB", data)
    if zero != 0 or dtype != 0x08 or ndim != expected_ndim:
        raise DatasetError(
            f"{path}: not a uint8 IDX file with {expected_ndim} dimensions "
            f"(header type 0x{dtype:02x}, ndim {ndim})"
        )
    dims = struct.unpack_from(f">{ndim}I", data, 4)
    offset = 4 + 4 * ndim
    size = int(np.prod(dims))
    if len(data) - offset != size:
        raise DatasetError(
            f"{path}: expected {size} data bytes for shape {dims}, got {len(data) - offset}"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims)


def _records(images: np.ndarray, labels: np.ndarray) -> Iterator[bytes]:
    label_entries = [feature_entry("label", int64_feature([k])) for k in range(256)]
    for img, lab in zip(images, labels.tolist()):
        yield example_from_entries(
            (feature_entry("image", bytes_feature(img.tobytes())), label_entries[lab])
        )


def _original_records(images: np.ndarray, labels: np.ndarray) -> Iterator[bytes]:
    """The original generators' schema: ``image`` a float_list of the 784 pixel values
    (0..255, row-major), ``label`` an int64_list of one value."""
    label_entries = [feature_entry("label", int64_feature([k])) for k in range(256)]
    for img, lab in zip(images, labels.tolist()):
        pixels = img.reshape(-1).astype(np.float32)  # a float32 array encodes as a float_list
        yield example_from_entries((feature_entry("image", pixels), label_entries[lab]))


def build(inputs: Inputs, limit: Optional[int]) -> Dict[str, Split]:
    return _build(inputs, limit, _records)


def build_original(inputs: Inputs, limit: Optional[int]) -> Dict[str, Split]:
    return _build(inputs, limit, _original_records)


def _build(inputs: Inputs, limit: Optional[int], records) -> Dict[str, Split]:
    paths = inputs.extra["paths"]
    out = {}
    for split in ("train", "test"):
        images = read_idx(paths[(split, "images")], 3)
        labels = read_idx(paths[(split, "labels")], 1)
        if images.shape[1:] != (28, 28) or len(images) != len(labels):
            raise DatasetError(
                f"{paths[(split, 'images')]}: expected N x 28 x 28 images matching "
                f"{len(labels)} labels, got shape {images.shape}"
            )
        if labels.size and labels.max() > 9:
            raise DatasetError(f"{paths[(split, 'labels')]}: label {labels.max()} outside 0..9")
        if limit is not None:
            images, labels = images[:limit], labels[:limit]
        out[split] = Split(len(labels), records(images, labels))
    return out


SPEC = DatasetSpec(
    name="fashion_mnist",
    description="Fashion-MNIST 28x28 grey images, 10 classes (60k train / 10k test)",
    records_per_shard=4096,
    schema_version=1,
    locate=locate,
    build=build,
    build_original=build_original,
)
