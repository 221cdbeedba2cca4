"""What the PS client and the trainer exchange: embedding table infos, the results of pulls and
pushes, the packed layout of dense tensors in flat blocks; and the deduplication of embedding
gradients before they are pushed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np
from elasticdl import ops
from elasticdl.common import shared_memory as shm
from elasticdl.common.tensor_utils import aligned_empty


class PSUnavailableError(RuntimeError):
    """A PS stayed unreachable longer than the retry budget."""


@dataclass
class EmbeddingTableInfo:
    name: str
    dim: int
    initializer: str = "uniform"
    dtype: np.dtype = field(default_factory=lambda: np.dtype(np.float32))
    vocabulary: int = 0  # the layer's input_dim; 0: unbounded (the PS cannot check the fit)


@dataclass
class PullResult:
    """Outcome of pull_dense_parameters: which PS are uninitialised, and the new parameters."""

    uninitialized_ps: List[int]
    parameters: Dict[str, np.ndarray]
    # PS id -> its flat parameter block, when every PS that sent parameters wrote them into a
    # packed shared-memory region or sent them as one block; else None.
    blocks: Optional[Dict[int, np.ndarray]] = None
    # The model's non-trainable state the PS hold, when the pull asked for it (include_state).
    state: Dict[str, np.ndarray] = field(default_factory=dict)
    # Some blocks may be views of shared-memory regions, valid until the next push (copy to
    # keep them); False: blocks that came in messages, the worker's own.
    blocks_are_views: bool = True

    @property
    def all_initialized(self) -> bool:
        return not self.uninitialized_ps


@dataclass(frozen=True)
class PackedLayout:
    """Where every dense parameter lies in one flat block per PS, the packed step's input and
    output: per PS, (name, element offset, size, shape) in block order. The blocks are those
    of the regions shared with the PS (SharedRegion.packed), or, when the tensors travel in
    messages, the worker's own (`message_layout`: the same order)."""

    entries: Tuple[Tuple[int, Tuple[Tuple[str, int, int, Tuple[int, ...]], ...]], ...]

    def entries_of(self, ps_id: int) -> Tuple[Tuple[str, int, int, Tuple[int, ...]], ...]:
        """PS `ps_id`'s (name, element offset, size, shape) in block order; () when it holds
        no dense parameter of the layout."""
        for pid, entries in self.entries:
            if pid == ps_id:
                return entries
        return ()

    def unpack(self, ps_id: int, block: np.ndarray) -> Dict[str, np.ndarray]:
        entries = self.entries_of(ps_id)
        if not entries:
            raise KeyError(ps_id)
        return shm.unpack_block(entries, block)

    def pack(self, params: Mapping[str, np.ndarray]) -> Optional[Dict[int, np.ndarray]]:
        """`params` copied into fresh blocks, one per PS, each aligned so that TensorFlow takes
        it without another copy; None when a parameter of the layout is missing."""
        blocks = {}
        for ps_id, entries in self.entries:
            if any(name not in params for name, *_ in entries):
                return None
            _, last, last_size, _ = entries[-1]
            block = aligned_empty(last + last_size, params[entries[0][0]].dtype)
            for name, offset, size, _ in entries:
                np.copyto(block[offset : offset + size], params[name].reshape(-1))
            blocks[ps_id] = block
        return blocks


def message_layout(
    layout_of: Sequence[Mapping[str, Tuple[np.dtype, Tuple[int, ...]]]]
) -> Optional[PackedLayout]:
    """The packed layout of dense tensors that travel in messages, from each PS's share of the
    model (name -> (dtype, shape)): per PS, its tensors back to back in name order, the order
    of a packed region (`SharedRegion.packed`), so both paths trace the same step. None when a
    PS's tensors are not of one dtype (they cannot share a block)."""
    entries = []
    for ps_id, specs in enumerate(layout_of):
        if not specs:
            continue
        if len({np.dtype(dtype) for dtype, _ in specs.values()}) != 1:
            return None
        mine, count = [], 0
        for name in sorted(specs):
            shape = tuple(int(d) for d in specs[name][1])
            size = int(np.prod(shape, dtype=np.int64))
            mine.append((name, count, size, shape))
            count += size
        entries.append((ps_id, tuple(mine)))
    return PackedLayout(tuple(entries)) if entries else None


@dataclass
class PackedGradients:
    """Dense gradients as one flat block per PS, laid out as `layout` says."""

    layout: PackedLayout
    blocks: Dict[int, np.ndarray]


@dataclass
class PushResult:
    accepted: bool
    versions: Dict[int, int]  # PS id -> version reported by that PS
    # push_gradients(pull_dense=True): the pull that came back with the push; None when a PS
    # did not answer it (one that predates the field), so the caller pulls separately. Its
    # arrays may be views of shared memory: valid until the next push, copy to keep them.
    pulled: Optional[PullResult] = None


class DistinctIdRows(NamedTuple):
    """An embedding gradient whose ids are distinct, in no particular order: an embedding
    layer's rows for its `tf.unique` ids. Pushed as it is, without the sort of
    `deduplicate_indexed_rows`: the PS ranks a push's ids when they do not increase, which
    costs it less than the sort costs the worker, and a repeated id would still be summed."""

    values: np.ndarray
    ids: np.ndarray


def deduplicate_indexed_rows(values: np.ndarray, ids: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Sum the rows of equal ids: gradients of one embedding row must reach the PS once."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    values = np.asarray(values)
    if values.dtype == np.float32 and values.ndim == 2 and values.shape[0] == ids.size:
        # One sort and a multi-threaded sum (elasticdl.ops) instead of NumPy's unique, a
        # scatter-add and, with no duplicates, a second sort.
        unique, summed = ops.sparse_aggregate(ids, values)
        return summed, unique
    unique, inverse = np.unique(ids, return_inverse=True)
    if unique.size == ids.size:
        order = np.argsort(ids, kind="stable")
        return values[order], ids[order]
    summed = np.zeros((unique.size,) + values.shape[1:], dtype=values.dtype)
    np.add.at(summed, inverse, values)
    return summed, unique
