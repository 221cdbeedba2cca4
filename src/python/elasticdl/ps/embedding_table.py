"""One embedding table shard with lazily initialised rows and its optimizer slots.

Storage is one contiguous, geometrically grown float32 block of shape (capacity, dim) plus an
`IdIndex` from row id to block row. Optimizer slots (Adam's m and v, Adagrad's accumulator, ...)
are blocks of the same shape that share the index, so a sparse optimizer kernel gets the
table and its slots as plain 2-D arrays addressed by the same row numbers. No block row -> id
column is kept (8 bytes a row, 4% of a 16-float row with Adam's slots): exports and
checkpoints read the pairs back from the index. Given the vocabulary (the layer's
``input_dim``), the index resolves the ids below it with a direct array instead of hashing
(`IdIndex`); rows, their order and their values are the same either way.

Not thread-safe: the owner (`Parameters`) serialises access.
"""
from __future__ import annotations

import mmap

import numpy as np
from elasticdl import ops
from elasticdl.ps import initializers
from elasticdl.ps.errors import PSError
from elasticdl.ps.id_index import IdIndex

_MIN_CAPACITY = 64
# Gathers NumPy's `take` does faster than the lookup kernel woken from a passive wait (figures:
# benchmarks/ps/README.md, "Which gather"): fewer rows than this, whatever their width ...
_KERNEL_MIN_ROWS = 12_000
# ... and rows narrower than this many bytes up to this many rows (the kernel's per-row copy
# and streaming stores do not pay for rows of a few floats).
_KERNEL_MIN_ROW_BYTES = 64
_NARROW_KERNEL_MIN_ROWS = 150_000
# Blocks of at least this many bytes are mappings of their own (see `_block`).
_MAPPED_BLOCK_BYTES = 1 << 20


class EmbeddingTable:
    def __init__(
        self, name: str, dim: int, initializer: str = "uniform", seed: int = 0, vocabulary: int = 0
    ):
        if dim <= 0:
            raise PSError(f"embedding table {name!r}: dim must be positive, got {dim}")
        self.name = name
        self.dim = int(dim)
        self.initializer = initializers.check_initializer(initializer)
        self.seed = initializers.table_seed(name, seed)
        self.vocabulary = int(vocabulary)  # 0: unknown
        self._index = IdIndex(vocabulary=self.vocabulary)
        self._values = _block(_MIN_CAPACITY, self.dim)
        self._slots: dict[str, np.ndarray] = {}
        self._slot_init: dict[str, float] = {}  # value of a slot in a freshly created row
        self._size = 0

    # ------------------------------------------------------------------ introspection
    def __len__(self) -> int:
        return self._size

    @property
    def values(self) -> np.ndarray:
        """The live rows as a contiguous (len, dim) view; row r belongs to id `ids[r]`."""
        return self._values[: self._size]

    @property
    def ids(self) -> np.ndarray:
        """Id of every live row (row r belongs to `ids[r]`), rebuilt from the index."""
        keys, rows = self._index.items()
        ids = np.empty(self._size, dtype=np.int64)
        ids[rows] = keys
        return ids

    @property
    def has_direct_index(self) -> bool:
        """Whether ids below the vocabulary are resolved by the direct index (`IdIndex`)."""
        return self._index.direct_size > 0

    @property
    def index_nbytes(self) -> int:
        """Bytes of the id -> row map (the direct index included)."""
        return self._index.nbytes

    @property
    def slot_names(self) -> tuple[str, ...]:
        return tuple(self._slots)

    def slot(self, slot: str, init: float = 0.0) -> np.ndarray:
        """The (len, dim) block of optimizer slot `slot`, filled with `init` on first use (and
        in rows created later)."""
        block = self._slots.get(slot)
        if block is None:
            # Only the live rows are written (rows appended later get `init` then): the
            # capacity beyond them, up to as much again, stays untouched and not resident.
            block = _block(self._values.shape[0], self.dim)
            block[: self._size] = init
            self._slots[slot] = block
            self._slot_init[slot] = float(init)
        return block[: self._size]

    def slot_table_name(self, slot: str) -> str:
        return f"{self.name}-{slot}"

    # ------------------------------------------------------------------ row management
    def _reserve(self, extra: int) -> None:
        needed = self._size + extra
        capacity = self._values.shape[0]
        if needed <= capacity:
            return
        new_capacity = max(needed, capacity * 2)
        self._values = _resized(self._values, new_capacity, self._size)
        for slot, block in self._slots.items():
            self._slots[slot] = _resized(block, new_capacity, self._size)

    def rows(self, ids: np.ndarray, create: bool = True, checked: bool = False) -> np.ndarray:
        """Block row of every id (duplicates allowed). Missing ids get new rows holding the
        initializer's values (and zero slots) when `create`, else a KeyError-like PSError.
        `checked`: `ids` is what `check_ids` returned (the PS checks a request's ids once, in
        Parameters.check_embedding_ids, not again at every use: a pass over them each time)."""
        if not checked:
            ids = check_ids(ids, self.name)
        rows, new_ids = self._index.resolve(ids, self._size)
        if new_ids.size:
            if not create:
                raise PSError(
                    f"embedding table {self.name!r} has no row for ids "
                    f"{ids[rows >= self._size][:5].tolist()}"
                )
            self._append(new_ids, None)  # rows from self._size on, as `resolve` numbered them
        return rows

    def _append(self, new_ids: np.ndarray, values: np.ndarray | None) -> np.ndarray:
        n = new_ids.shape[0]
        self._reserve(n)
        start = self._size
        rows = np.arange(start, start + n, dtype=np.int64)
        if values is None:
            values = initializers.initial_values(self.initializer, self.seed, new_ids, self.dim)
        self._values[start : start + n] = values
        for slot, block in self._slots.items():
            block[start : start + n] = self._slot_init[slot]
        self._index.insert(new_ids, rows)
        self._size += n
        return rows

    # ------------------------------------------------------------------ get / set
    def get(self, ids: np.ndarray, checked: bool = False) -> np.ndarray:
        """Copy of the rows for `ids` (n, dim), creating unseen rows lazily (`checked`: as in
        `rows`)."""
        rows = self.rows(ids, checked=checked)
        if not kernel_gathers(rows.size, self.dim * self._values.itemsize):
            return np.take(self._values, rows, axis=0)
        # The lookup kernel: a prefetched, multi-threaded gather into pooled memory, faster than
        # NumPy's fancy indexing for many wide rows (benchmarks/ops/RESULTS.md).
        return ops.embedding_lookup(self._values, rows)

    def set(self, ids: np.ndarray, values: np.ndarray, slot: str | None = None) -> None:
        """Overwrite (creating if needed) rows of the table or of one of its slots."""
        ids = check_ids(ids, self.name)
        values = np.asarray(values, dtype=np.float32)
        if values.shape != (ids.shape[0], self.dim):
            raise PSError(
                f"embedding table {self.name!r}: values of shape {values.shape} do not match "
                f"{ids.shape[0]} ids of dim {self.dim}"
            )
        rows = self.rows(ids)
        if slot is None:
            self._values[rows] = values
        else:
            self.slot(slot)
            self._slots[slot][rows] = values

    def export(self, slot: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, values) copies of all rows (or of a slot), sorted by id for stable output."""
        keys, rows = self._index.items()
        order = np.argsort(keys)  # ids are unique: any sort is stable
        block = self.values if slot is None else self.slot(slot)
        return keys[order], block[rows[order]]


def kernel_gathers(rows: int, row_bytes: int) -> bool:
    """Whether a gather of `rows` rows of `row_bytes` each runs on the lookup kernel (else on
    NumPy's `take`, faster for few or narrow rows)."""
    if rows < _KERNEL_MIN_ROWS:
        return False
    return row_bytes >= _KERNEL_MIN_ROW_BYTES or rows >= _NARROW_KERNEL_MIN_ROWS


def check_ids(ids, table: str) -> np.ndarray:
    """`ids` as a 1-D int64 array once they are integers and non-negative; a PSError else."""
    ids = id_array(ids, table)
    if ids.size:
        check_lowest_id(int(ids.min()), table)
    return ids


def id_array(ids, table: str) -> np.ndarray:
    """`ids` as a 1-D int64 array once they are integers (any sign); a PSError else."""
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu":
        raise PSError(f"embedding table {table!r}: ids must be integers, got dtype {ids.dtype}")
    return ids.astype(np.int64, copy=False).reshape(-1)


def check_lowest_id(lowest: int, table: str) -> None:
    if lowest < 0:
        raise PSError(f"embedding table {table!r}: ids must be non-negative, got {lowest}")


def strictly_increasing(ids: np.ndarray) -> bool:
    """Whether every id is larger than the one before: then none repeats. An O(n) pass, where
    finding out otherwise costs a sort; what the PS checks before it trusts ids to be unique."""
    return ids.size < 2 or bool((ids[1:] > ids[:-1]).all())


def _block(capacity: int, dim: int) -> np.ndarray:
    """An uninitialised (capacity, dim) float32 block. From 1 MiB on it is an anonymous mapping
    of its own, unmapped when the block is dropped: the PS's malloc keeps freed heap memory up to
    its trim threshold (elasticdl.common.malloc_tuning), and the blocks a growing table leaves
    behind (each doubling frees the previous table and slots) would stay in the process's RSS
    (figures: benchmarks/ps/README.md, table_sweep.py). Untouched pages stay unmapped either way.

    The mapping is private, not the shared one ``mmap`` makes by default: a checkpoint is
    written by a forked child from a copy-on-write view of the PS's memory
    (elasticdl.ps.snapshot_writer), and a shared mapping would go on changing under it."""
    nbytes = capacity * dim * 4
    if nbytes < _MAPPED_BLOCK_BYTES:
        return np.empty((capacity, dim), dtype=np.float32)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    return np.frombuffer(region, dtype=np.float32).reshape(capacity, dim)


def _resized(array: np.ndarray, capacity: int, live: int) -> np.ndarray:
    """A block of `capacity` rows holding the first `live` rows of `array`."""
    out = _block(capacity, array.shape[1])
    out[:live] = array[:live]
    return out
