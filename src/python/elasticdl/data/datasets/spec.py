"""What a preparable dataset declares: where its raw inputs are and how to turn them into
train/test records (serialized ``tf.train.Example`` bytes)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np


@dataclass
class Split:
    """One output split: how many records, and an iterator producing them once."""

    num_records: int
    records: Iterator[bytes]
    # What the manifest records about the split besides counts (e.g. a generated dataset's
    # best reachable AUC); JSON-serialisable.
    metadata: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Inputs:
    """Resolved raw inputs: files whose bytes define the dataset, plus how to open them."""

    files: List[str]
    # Bytes fed to the content hash when it is not simply the files (e.g. one member of a
    # wheel); None: hash the files.
    digest_parts: Optional[Callable[[], Iterator[bytes]]] = None
    extra: Dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    description: str
    records_per_shard: int
    schema_version: int
    locate: Callable[[Optional[str]], Inputs]
    build: Callable[[Inputs, Optional[int]], Dict[str, Split]]
    # The records in the schema the original ElasticDL's data generators wrote (what model
    # files written for it parse); None: the dataset has no such schema.
    build_original: Optional[Callable[[Inputs, Optional[int]], Dict[str, Split]]] = None
    # Generated datasets: the dataclass of their parameters (flags of `dataset prepare`), with
    # a check() raising DatasetError and identity() bytes; build() finds the checked instance
    # in inputs.extra["params"]. None: the dataset takes no parameters.
    params_type: Optional[type] = None


SPLIT_SEED = 20200101
TEST_FRACTION = 0.2


def split_indices(n: int, seed: int = SPLIT_SEED) -> Dict[str, np.ndarray]:
    """Deterministic shuffled 80/20 split of ``range(n)``, identical on every machine."""
    perm = np.random.Generator(np.random.PCG64(seed)).permutation(n)
    n_test = int(round(n * TEST_FRACTION))
    return {"train": perm[n_test:], "test": perm[:n_test]}
