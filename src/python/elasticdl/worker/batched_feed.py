"""A model's per-record `feed`, run on a whole chunk of records in one call.

A model file's `feed(dataset, mode, metadata)` maps a dataset of single records (the worker
batches after it, as the original ElasticDL does). tf.data pays a fixed cost per element and
map call that dwarfs the parsing itself on small records: a DeepFM record of 40 values parses
in well under a microsecond inside `tf.io.parse_example`, but costs 20-35 us as its own element
of a `map` (benchmarks/runtime/README.md). When `feed` is only a chain of `map`s over dense
tensors, the same functions can run once over all the records of a chunk, vectorized by
TensorFlow's `pfor` (`tf.vectorized_map`): one element instead of thousands.

`BatchedFeed.of(fed, records)` finds that chain (`fed` must be `records` followed by maps and
shuffles and nothing else: a `filter`, `interleave`, `prefetch` or a sparse or ragged value
leaves the feed per record) and returns a callable from a vector of records to the batched
structure that the maps then `batch(n)` would give (the shuffles, `BatchedFeed.shuffle`, then
run on its records), or None with the reason. Whether the two agree is the caller's to check
on real data (`same_values` against `BatchedFeed.one`, the maps record by record): `pfor`
refuses what it cannot vectorize (a `py_function`, most stateful ops), but a function whose
per-record results cannot be batched (records of different lengths) or that draws random
numbers would give different values, and only the comparison tells.
"""
from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import numpy as np
import tensorflow as tf

_MAP_DATASETS = ("_MapDataset", "_ParallelMapDataset")
_SHUFFLE_DATASET = "_ShuffleDataset"


@contextlib.contextmanager
def quiet_tf_logger():
    """pfor logs every op it cannot vectorize as an error with a traceback; here that only
    means the feed stays per record, which the caller logs in one line."""
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


# Ops that act on each element of their one input on their own (DecodeRaw appends a dimension
# of the decoded values), which TensorFlow's pfor has no rule for: for a vector of records they
# are the same op on the vector. The check on the first task still compares the values.
ELEMENTWISE_OPS = (
    "DecodeRaw",
    "StringToNumber",
    "AsString",
    "StringStrip",
    "StringToHashBucketFast",
    "DecodeBase64",
)


def _register_elementwise_ops() -> None:
    try:
        from tensorflow.python.ops.parallel_for import pfor
    except ImportError:  # pragma: no cover - another TensorFlow: those feeds stay per record
        return
    registry = getattr(pfor, "_pfor_converter_registry", None)
    convert = getattr(pfor, "_convert_cwise", None)
    if registry is None or convert is None:  # pragma: no cover
        return
    for name in ELEMENTWISE_OPS:
        if name not in registry:
            pfor.RegisterPFor(name)(convert)


_register_elementwise_ops()


def _dense_only(structure) -> bool:
    return all(isinstance(spec, tf.TensorSpec) for spec in tf.nest.flatten(structure))


@dataclass(frozen=True)
class Shuffle:
    """A `shuffle` of the feed, to apply again to the batched feed's records."""

    buffer_size: Any
    seed: Optional[int]  # the op-level seed: with the same global seed, the same seeds
    reshuffle_each_iteration: bool

    def apply(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        return dataset.shuffle(
            self.buffer_size,
            seed=self.seed,
            reshuffle_each_iteration=self.reshuffle_each_iteration,
        )


def map_chain(fed: tf.data.Dataset, records: tf.data.Dataset) -> Tuple[Optional[list], list, str]:
    """The map functions (tf.data's function wrappers) that turn `records` into `fed`, first
    one first, and the shuffles among them, or (None, [], why not). A shuffle of a record's
    values commutes with a map of each record, so the shuffles can run after all the maps."""
    chain: List[Any] = []
    shuffles: List[Shuffle] = []
    node = fed
    while node is not records:
        kind = type(node).__name__
        if kind == _SHUFFLE_DATASET:
            shuffles.append(
                Shuffle(node._buffer_size, node._seed2, bool(node._reshuffle_each_iteration))
            )
            node = node._input_dataset
            continue
        if kind not in _MAP_DATASETS:
            return None, [], f"feed applies {kind.strip('_')}, not only map and shuffle"
        wrapper = getattr(node, "_map_func", None)
        node = getattr(node, "_input_dataset", None)
        if wrapper is None or node is None:
            return None, [], "this TensorFlow's map datasets do not expose their function"
        chain.append(wrapper)
    if not chain:
        return None, [], "feed maps nothing"
    for wrapper in chain:
        if not (_dense_only(wrapper._input_structure) and _dense_only(wrapper._output_structure)):
            return None, [], "feed maps sparse or ragged values"
    return list(reversed(chain)), list(reversed(shuffles)), ""


class BatchedFeed:
    """The composed map functions of a per-record feed, over a vector of records, and the
    feed's shuffles."""

    def __init__(self, chain: list, shuffles: Optional[List[Shuffle]] = None):
        self._chain = chain
        self.shuffles = list(shuffles or [])

    @classmethod
    def of(cls, fed: tf.data.Dataset, records: tf.data.Dataset):
        """(BatchedFeed or None, why not)."""
        chain, shuffles, why = map_chain(fed, records)
        return (cls(chain, shuffles), "") if chain else (None, why)

    def one(self, record):
        """The feed's maps on one record (the per-record values `__call__` must equal)."""
        value = record
        for wrapper in self._chain:
            outputs = wrapper.function(*tf.nest.flatten(value))
            value = tf.nest.pack_sequence_as(wrapper._output_structure, tf.nest.flatten(outputs))
        return value

    def __call__(self, records: tf.Tensor):
        """What the feed's maps of each record then `batch` give for `records` (shape [n]), in
        one call; raises where pfor cannot vectorize a function. The shuffles are not in it."""
        return tf.vectorized_map(self.one, records, fallback_to_while_loop=False)

    def shuffle(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """`dataset` (of records' values) through the feed's shuffles, in order."""
        for shuffle in self.shuffles:
            dataset = shuffle.apply(dataset)
        return dataset


def failure_reason(err: BaseException) -> str:
    """One line from a tracing or vectorizing error: pfor's missing rule where it names one,
    else the message's last line (TensorFlow puts the user-code frames first)."""
    text = str(err)
    found = re.search(r"No pfor vectorization defined for \S+", text)
    if found:
        return found.group(0)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[-1][:200] if lines else ''}"


def same_values(a, b) -> bool:
    """Same structure, dtypes, shapes and values (NaN equal to NaN)."""
    try:
        tf.nest.assert_same_structure(a, b, expand_composites=True)
    except (ValueError, TypeError):
        return False
    for x, y in zip(
        tf.nest.flatten(a, expand_composites=True), tf.nest.flatten(b, expand_composites=True)
    ):
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        x, y = x.numpy(), y.numpy()
        nan_equal = x.dtype.kind in "fc"
        if not np.array_equal(x, y, equal_nan=nan_equal):
            return False
    return True
