"""The id -> row map of an embedding table: a hash map from non-negative int64 ids to rows.

Embedding lookups arrive as batches of thousands of ids; a Python dict would cost one
interpreter round trip per id. With the native ops backend the map is ``elasticdl_native.IdMap``
(C++ open addressing at load factor <= 4/5, prefetched and multi-threaded lookups; figures in
benchmarks/ops/RESULTS.md and benchmarks/ps/README.md); otherwise, or with
``ELASTICDL_OPS_BACKEND=reference``, the NumPy table below, which
resolves a batch with a handful of vectorised passes (linear probing, multiplicative hashing,
load factor <= 1/2) and inserts in O(batch) rather than O(table) as a sorted-array index would.
Both give the same answers; the tests run each.

A table whose vocabulary V is known (the Keras layer's ``input_dim``) also gets a direct index
for the ids below V: an int64 array of V entries holding each id's row (-1: no row yet), so a
lookup is one gather and an insert one scatter, with no hashing. Ids of V and above (a model
may feed ids past its ``input_dim``) stay in the hash map, so every id maps as it would
without the direct index. Its cost is 8 bytes an id of the whole vocabulary on every PS, from
the start (a PS holds every N-th id, so each page is written sooner or later anyway); the
memory check before training (elasticdl.ps.memory_fit) already counts, for every row of a PS's
share of that vocabulary, the row and 30 bytes of hash map: with up to 3 PS the direct index
takes less than that (the hash map beside it holds only the ids past V), with more it takes up
to 8 bytes an id more. It is used up to ``DIRECT_INDEX_MAX_BYTES`` (64 MiB, 8M ids), which
bounds that excess; larger vocabularies keep the hash map alone.
"""
from __future__ import annotations

import numpy as np
from elasticdl.ops import _backend

_EMPTY = -1  # ids are non-negative, so -1 marks a free slot
_HASH_MUL = np.uint64(0x9E3779B97F4A7C15)
_MAX_LOAD = 0.5
DIRECT_INDEX_MAX_BYTES = 64 << 20
# The hash map's capacity beside a direct index: it holds only ids past the vocabulary.
_SPILL_CAPACITY = 16


def direct_index_size(vocabulary: int) -> int:
    """Entries of the direct index a table of `vocabulary` ids gets: the vocabulary, or 0 (no
    direct index) when it is unknown (0) or its array would exceed DIRECT_INDEX_MAX_BYTES."""
    return vocabulary if 0 < vocabulary <= DIRECT_INDEX_MAX_BYTES // 8 else 0


class IdIndex:
    """Row of every id; ids are inserted once (unique, absent) with the row they get."""

    def __init__(self, capacity: int = 1024, native: bool | None = None, vocabulary: int = 0):
        """``native``: use the C++ map (default: when the native ops backend is active).
        ``vocabulary``: ids below it go to a direct index (module docstring) when
        `direct_index_size` allows one; 0: unknown, the hash map alone."""
        if native is None:
            native = _backend.native is not None
        if native and _backend.native is None:
            raise RuntimeError("IdIndex(native=True): elasticdl_native is not available")
        size = direct_index_size(vocabulary)
        self._direct = np.full(size, _EMPTY, dtype=np.int64) if size else None
        self._direct_len = 0
        if size:
            capacity = min(capacity, _SPILL_CAPACITY)
        self._impl = _backend.native.IdMap(capacity) if native else NumpyIdIndex(capacity)

    def __len__(self) -> int:
        return self._direct_len + len(self._impl)

    @property
    def direct_size(self) -> int:
        """Ids the direct index covers (those below it): 0 when there is none."""
        return 0 if self._direct is None else self._direct.shape[0]

    def _in_direct(self, ids: np.ndarray) -> np.ndarray:
        # Unsigned, a negative id compares as huge: it goes to the hash map, never wraps around.
        return ids.view(np.uint64) < np.uint64(self._direct.shape[0])

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Row of every id (duplicates allowed); -1 where the id is absent."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if self._direct is None:
            return self._impl.lookup(ids)
        inside = self._in_direct(ids)
        if inside.all():
            return self._direct[ids]
        rows = np.empty(ids.shape[0], dtype=np.int64)
        rows[inside] = self._direct[ids[inside]]
        outside = ~inside
        rows[outside] = self._impl.lookup(np.ascontiguousarray(ids[outside]))
        return rows

    def resolve(self, ids: np.ndarray, next_row: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, new_ids): the row of every id (duplicates allowed), where an absent id gets
        ``next_row`` + its rank among the distinct absent ids in order of first appearance, and
        those ids in that order: the rows that appending ``new_ids`` from ``next_row`` on gives
        them. Inserts nothing. The native map answers in one call."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if not isinstance(self._impl, NumpyIdIndex):
            return self._impl.resolve(self._direct, ids, next_row)
        rows = self.lookup(ids)
        missing = rows < 0
        if not missing.any():
            return rows, ids[:0]
        absent = ids[missing]
        distinct, first = np.unique(absent, return_index=True)
        order = np.argsort(first)  # distinct ids by first appearance
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        rows[missing] = next_row + rank[np.searchsorted(distinct, absent)]
        return rows, distinct[order]

    def insert(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Add ids (unique, not yet present) mapping to rows (>= 0)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        rows = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
        if not ids.size:
            return
        if self._direct is None:
            self._impl.insert(ids, rows)
            return
        inside = self._in_direct(ids)
        if inside.all():
            self._direct[ids] = rows
            self._direct_len += ids.shape[0]
            return
        self._direct[ids[inside]] = rows[inside]
        self._direct_len += int(np.count_nonzero(inside))
        outside = ~inside
        self._impl.insert(np.ascontiguousarray(ids[outside]), np.ascontiguousarray(rows[outside]))

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, rows) of every entry, in no particular order: the table keeps no id column,
        so checkpoints and exports read the ids back from here."""
        keys, rows = self._impl.items()
        if self._direct is None:
            return keys, rows
        direct_ids = np.flatnonzero(self._direct != _EMPTY)
        return (
            np.concatenate([direct_ids.astype(np.int64, copy=False), keys]),
            np.concatenate([self._direct[direct_ids], rows]),
        )

    @property
    def nbytes(self) -> int:
        """Bytes the map's slots and the direct index take."""
        direct = 0 if self._direct is None else self._direct.nbytes
        return direct + int(self._impl.nbytes)


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
