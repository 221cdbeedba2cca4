"""Counter-based uniforms: the random numbers of new embedding rows' initial values.

The value at (row id, column c, stream s) is a pure function of (seed, id, c, s):
``key = splitmix64(uint64(id) ^ seed)``, ``z = mix(key + (c + s * dim + 1) * GOLDEN)`` (mix:
splitmix64's finaliser) and ``u = (z >> 40) * 2**-24``, in [0, 1) and exact in float32. So a
row's initial value does not depend on the order in which rows are first requested, nor on
how many parameter servers share the table.

The native extension fills a whole (n, dim) block in one pass; the NumPy below is the
reference (what serves without the extension or with ELASTICDL_OPS_BACKEND=reference), and the
native results are its bits exactly.
"""
from __future__ import annotations

import numpy as np
from elasticdl.ops import _backend

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_U64 = 0xFFFFFFFFFFFFFFFF
_CHUNK_ELEMENTS = 1 << 15  # keeps the uint64 scratch arrays in the CPU cache


def uniform01(seed: int, ids: np.ndarray, dim: int, stream: int) -> np.ndarray:
    """(len(ids), dim) float32 uniforms in [0, 1) of (seed, id, column, stream)."""
    ids = _ids(ids, dim)
    if _backend.native is not None:
        return _backend.native.cpu_uniform01(seed & _U64, ids, dim, stream)
    return reference_uniform01(seed, ids, dim, stream)


def scaled_uniform(seed: int, ids: np.ndarray, dim: int, limit) -> np.ndarray:
    """``(2u - 1) * limit`` of stream 0 as float32 (len(ids), dim): U(-limit, limit).

    ``limit`` is multiplied in the precision NumPy gives a float32 array times it (float32
    for a Python float; for a NumPy float64 that depends on the NumPy version), so the result
    is the reference's bits whatever the type of ``limit``."""
    ids = _ids(ids, dim)
    if _backend.native is not None:
        return _backend.native.cpu_uniform_scaled(
            seed & _U64, ids, dim, float(limit), _limit_in_double(limit)
        )
    return reference_scaled_uniform(seed, ids, dim, limit)


_IN_DOUBLE: dict = {}  # (type, value) of a limit -> whether NumPy multiplies in float64


def _limit_in_double(limit) -> bool:
    """Whether a float32 array times `limit` is float64 in this NumPy. Keyed by type and value:
    NumPy before NEP 50 decides by the value too (a float64 too large for float32 promotes)."""
    key = (type(limit), limit)
    known = _IN_DOUBLE.get(key)
    if known is None:
        known = (np.zeros(1, np.float32) * limit).dtype == np.float64
        if len(_IN_DOUBLE) < 256:  # a table's limits are few; a stream of new ones is not kept
            _IN_DOUBLE[key] = known
    return known


def _ids(ids, dim: int) -> np.ndarray:
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    return np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)


def reference_scaled_uniform(seed: int, ids: np.ndarray, dim: int, limit) -> np.ndarray:
    out = (2.0 * reference_uniform01(seed, _ids(ids, dim), dim, 0) - 1.0) * limit
    return np.asarray(out, dtype=np.float32)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    # uint64 array arithmetic wraps modulo 2**64, which is exactly what splitmix64 needs.
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def _mix_inplace(z: np.ndarray, tmp: np.ndarray) -> None:
    """splitmix64's finaliser in place (no temporaries beyond `tmp`)."""
    for shift, mul in ((30, _MIX1), (27, _MIX2)):
        np.right_shift(z, np.uint64(shift), out=tmp)
        np.bitwise_xor(z, tmp, out=z)
        np.multiply(z, mul, out=z)
    np.right_shift(z, np.uint64(31), out=tmp)
    np.bitwise_xor(z, tmp, out=z)


def reference_uniform01(seed: int, ids: np.ndarray, dim: int, stream: int) -> np.ndarray:
    ids = _ids(ids, dim)
    row_keys = _splitmix64(ids.astype(np.uint64) ^ np.uint64(seed & _U64))
    cols = (np.arange(dim, dtype=np.uint64) + np.uint64(stream * dim + 1)) * _GOLDEN
    out = np.empty((ids.shape[0], dim), dtype=np.float32)
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // dim)
    z = np.empty((rows_per_chunk, dim), dtype=np.uint64)
    tmp = np.empty_like(z)
    for start in range(0, ids.shape[0], rows_per_chunk):
        keys = row_keys[start : start + rows_per_chunk]
        zc, tc = z[: keys.shape[0]], tmp[: keys.shape[0]]
        np.add(keys[:, None], cols[None, :], out=zc)
        _mix_inplace(zc, tc)
        np.right_shift(zc, np.uint64(40), out=zc)  # top 24 bits: exact in float32
        np.multiply(zc, 1.0 / (1 << 24), out=out[start : start + keys.shape[0]], casting="unsafe")
    return out


def uniform01_at(seed: int, ids: np.ndarray, cols: np.ndarray, dim: int, stream: int) -> np.ndarray:
    """Element-wise ``uniform01(...)[r, c]`` for matching arrays of ids and columns (NumPy:
    only the few values a truncated normal redraws come this way)."""
    keys = _splitmix64(ids.astype(np.uint64) ^ np.uint64(seed & _U64))
    z = keys + (cols.astype(np.uint64) + np.uint64(stream * dim + 1)) * _GOLDEN
    _mix_inplace(z, np.empty_like(z))
    return (z >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / (1 << 24))
