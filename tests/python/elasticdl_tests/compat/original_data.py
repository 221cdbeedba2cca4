"""Fashion-MNIST in the original ElasticDL's schema (``image`` as 784 floats, ``label`` int64),
as the original's data generators wrote it, for the original-style model files here."""

from __future__ import annotations

import pytest
from elasticdl.data.datasets import prepare
from elasticdl.data.datasets.errors import DatasetError


def prepare_original_fashion_mnist(directory, records: int):
    """The first ``records`` rows of each split under ``directory`` (shards of 1,024); the
    test skips when the dataset cannot be had (no network and no cached Debian package)."""
    try:
        return prepare(
            "fashion_mnist",
            str(directory),
            progress=False,
            limit=records,
            records_per_shard=1024,
            schema="original",
        )
    except DatasetError as e:
        pytest.skip(f"Fashion-MNIST unavailable: {e}")
