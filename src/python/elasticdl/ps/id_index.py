"""The id -> row map of an embedding table: a hash map from non-negative int64 ids to rows.

Embedding lookups arrive as batches of thousands of ids; a Python dict would cost one
interpreter round trip per id. With the native ops backend the map is ``elasticdl_native.IdMap``
(C++ open addressing at load factor <= 4/5, prefetched and multi-threaded lookups; figures in
benchmarks/ops/RESULTS.md and benchmarks/ps/README.md); otherwise, or with
``ELASTICDL_OPS_BACKEND=reference``, the NumPy table below, which
resolves a batch with a handful of vectorised passes (linear probing, multiplicative hashing,
load factor <= 1/2) and inserts in O(batch) rather than O(table) as a sorted-array index would.
Both give the same answers; the tests run each.
"""
from __future__ import annotations

import numpy as np
from elasticdl.ops import _backend

_EMPTY = -1  # ids are non-negative, so -1 marks a free slot
_HASH_MUL = np.uint64(0x9E3779B97F4A7C15)
_MAX_LOAD = 0.5


class IdIndex:
    """Row of every id; ids are inserted once (unique, absent) with the row they get."""

    def __init__(self, capacity: int = 1024, native: bool | None = None):
        """``native``: use the C++ map (default: when the native ops backend is active)."""
        if native is None:
            native = _backend.native is not None
        if native and _backend.native is None:
            raise RuntimeError("IdIndex(native=True): elasticdl_native is not available")
        self._impl = _backend.native.IdMap(capacity) if native else NumpyIdIndex(capacity)

    def __len__(self) -> int:
        return len(self._impl)

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Row of every id (duplicates allowed); -1 where the id is absent."""
        return self._impl.lookup(np.ascontiguousarray(ids, dtype=np.int64).reshape(-1))

    def insert(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Add ids (unique, not yet present) mapping to rows (>= 0)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        rows = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
        if ids.size:
            self._impl.insert(ids, rows)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, rows) of every entry, in no particular order: the table keeps no id column,
        so checkpoints and exports read the ids back from here."""
        return self._impl.items()

    @property
    def nbytes(self) -> int:
        """Bytes the map's slots take."""
        return int(self._impl.nbytes)


class NumpyIdIndex:
    def __init__(self, capacity: int = 1024):
        self._bits = max(4, int(np.ceil(np.log2(max(capacity, 16) / _MAX_LOAD))))
        self._keys = np.full(1 << self._bits, _EMPTY, dtype=np.int64)
        self._vals = np.empty(1 << self._bits, dtype=np.int64)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        live = self._keys != _EMPTY
        return self._keys[live], self._vals[live]

    @property
    def nbytes(self) -> int:
        return self._keys.nbytes + self._vals.nbytes

    @property
    def _mask(self) -> int:
        return (1 << self._bits) - 1

    def _home(self, ids: np.ndarray) -> np.ndarray:
        # Fibonacci hashing: the top bits of id * golden ratio spread sequential ids evenly.
        with np.errstate(over="ignore"):
            h = ids.astype(np.uint64) * _HASH_MUL
        return (h >> np.uint64(64 - self._bits)).astype(np.int64)

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Row of every id (duplicates allowed); -1 where the id is absent."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        rows = np.full(ids.shape[0], -1, dtype=np.int64)
        pending = np.arange(ids.shape[0])
        pos = self._home(ids)
        mask = self._mask
        while pending.size:
            keys = self._keys[pos]
            want = ids[pending]
            hit = keys == want
            if hit.any():
                rows[pending[hit]] = self._vals[pos[hit]]
            go_on = ~hit & (keys != _EMPTY)
            pending = pending[go_on]
            pos = (pos[go_on] + 1) & mask
        return rows

    def insert(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Add ids (unique, not yet present) mapping to rows."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            return
        if (self._size + ids.size) > _MAX_LOAD * (1 << self._bits):
            self._grow(self._size + ids.size)
        self._insert_unchecked(ids, rows)
        self._size += ids.size

    def _insert_unchecked(self, ids: np.ndarray, rows: np.ndarray) -> None:
        mask = self._mask
        pending = np.arange(ids.shape[0])
        pos = self._home(ids)
        while pending.size:
            free = self._keys[pos] == _EMPTY
            done = np.zeros(pending.shape[0], dtype=bool)
            cand = np.flatnonzero(free)
            if cand.size:
                # Several pending ids may probe the same free slot: the first one takes it, the
                # others see it occupied on the next pass and move on.
                _, first = np.unique(pos[cand], return_index=True)
                winners = cand[first]
                self._keys[pos[winners]] = ids[pending[winners]]
                self._vals[pos[winners]] = rows[pending[winners]]
                done[winners] = True
            pos = np.where(free, pos, (pos + 1) & mask)
            keep = ~done
            pending = pending[keep]
            pos = pos[keep]

    def _grow(self, needed: int) -> None:
        live = self._keys != _EMPTY
        old_keys, old_vals = self._keys[live], self._vals[live]
        while needed > _MAX_LOAD * (1 << self._bits):
            self._bits += 1
        self._keys = np.full(1 << self._bits, _EMPTY, dtype=np.int64)
        self._vals = np.empty(1 << self._bits, dtype=np.int64)
        self._insert_unchecked(old_keys, old_vals)
