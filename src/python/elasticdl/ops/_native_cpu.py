"""CPU arrays -> the C++/OpenMP kernels of ``elasticdl_native`` (:class:`NativeCpuBackend`).

Same results as :mod:`elasticdl.ops.reference`; the argument checks are the shared ones in
:mod:`elasticdl.ops._checks`, ids are range-checked inside the kernels.
"""

from __future__ import annotations

import numpy as np
from elasticdl.ops import _backend
from elasticdl.ops import _checks as C
from elasticdl.ops.errors import IdOutOfRangeError, OpsError
from elasticdl.ops.interface import OpsBackend, OptKind, adam_lr_t, slot_count_error

_N = _backend.native

# Must match edl::DType / edl::Combiner in src/cc/kernels.h (OptKind's values are edl::OptKind).
COMBINER_CODE = {"sum": 0, "mean": 1, "sqrtn": 2}


def dtype_code(dt) -> int:
    if dt == np.float32:
        return 0
    if dt == np.float16:
        return 1
    return 2  # bfloat16 (LOOKUP_DTYPES is checked first)


def _ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _raise_bad(pos: int, ids: np.ndarray, rows: int) -> None:
    if pos >= 0:
        raise IdOutOfRangeError(pos, int(ids[pos]), rows)


def _pooled_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose memory returns to the native pool when freed
    (a lookup result made every step then reuses mapped pages instead of faulting in new
    ones)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return _N.pooled_bytes(nbytes).view(dtype).reshape(shape)


def embedding_lookup(table, ids, offsets=None, combiner=None, weights=None, out=None):
    table = C.table_2d("table", table)
    if table.dtype not in C.LOOKUP_DTYPES:
        raise C.OpsTypeError(
            f"table: expected one of {[str(d) for d in C.LOOKUP_DTYPES]}, got {table.dtype}"
        )
    table = np.ascontiguousarray(table)
    ids = C.ids_int64(ids)
    comb = C.combiner_name(combiner, offsets)
    rows, dim = table.shape
    if comb is None:
        if weights is not None:
            raise OpsError("weights: only used when pooling bags; pass offsets and a combiner")
        shape = (ids.size, dim)
        out = (
            _pooled_empty(shape, table.dtype)
            if out is None
            else C.output_array("out", out, shape, table.dtype)
        )
        _raise_bad(
            _N.cpu_lookup(
                _ptr(table), dtype_code(table.dtype), rows, dim, _ptr(ids), ids.size, _ptr(out)
            ),
            ids,
            rows,
        )
        return out
    offs = C.offsets_int64(offsets, ids.size)
    w = C.float32_input("weights", weights, (ids.size,)) if weights is not None else None
    shape = (offs.size - 1, dim)
    out = (
        np.empty(shape, dtype=np.float32)
        if out is None
        else C.output_array("out", out, shape, np.float32)
    )
    bad = _N.cpu_lookup_pooled(
        _ptr(table),
        dtype_code(table.dtype),
        rows,
        dim,
        _ptr(ids),
        ids.size,
        _ptr(offs),
        offs.size - 1,
        _ptr(w) if w is not None else 0,
        COMBINER_CODE[comb],
        _ptr(out),
    )
    _raise_bad(bad, ids, rows)
    return out


def sparse_aggregate(ids, grads):
    ids = C.ids_int64(ids)
    grads = C.float32_input("grads", grads)
    if grads.ndim != 2 or grads.shape[0] != ids.size:
        raise OpsError(f"grads: expected shape ({ids.size}, dim) to match ids, got {grads.shape}")
    # Ids that come sorted and unique skip the ranking: one pass finds out, and it stops at
    # the first id out of order.
    args = (_ptr(ids), ids.size, _ptr(grads), grads.shape[1])
    return _N.cpu_aggregate_increasing(*args) or _N.cpu_aggregate(*args)


def dense_accumulate(out, grads, scale=1.0):
    out = C.float32_inplace("out", out)
    glist = [grads] if not isinstance(grads, (list, tuple)) else list(grads)
    if not glist:
        return out
    gs = [C.float32_input(f"grads[{i}]", g, out.shape) for i, g in enumerate(glist)]
    _N.cpu_dense_accumulate(_ptr(out), [_ptr(g) for g in gs], out.size, float(scale))
    return out


def _slot_ptrs(spec, slots, shape, like):
    """Addresses of the slot arrays (0 for unused ones), checked like the parameter."""
    names = spec.slot_args
    if len(slots) != len(names):
        raise slot_count_error(spec, slots, like)
    ptrs = [0, 0, 0]
    for k, s in enumerate(slots):
        if s is None:
            raise slot_count_error(spec, slots, like)
        ptrs[k] = _ptr(C.float32_inplace(names[k], s, shape))
    return ptrs


def dense_update(spec, param, grad, slots, lr, step=1):
    param = C.float32_inplace("param", param)
    grad = C.float32_input("grad", grad, param.shape)
    s0, s1, s2 = _slot_ptrs(spec, slots, param.shape, "param")
    if spec.kind is OptKind.ADAM:
        lr = adam_lr_t(lr, spec.beta_1, spec.beta_2, C.positive_step(step))
    _N.cpu_dense_update(
        spec.kind, lr, *spec.native_scalars, _ptr(param), _ptr(grad), s0, s1, s2, param.size
    )


def sparse_update(spec, table, ids, grads, slots, lr, step=1, unique_ids=False):
    table = C.float32_inplace("table", table)
    if table.ndim != 2:
        raise OpsError(f"table: expected a 2-D (rows, dim) table, got shape {table.shape}")
    ids = C.ids_int64(ids)
    rows, dim = table.shape
    grads = C.float32_input("grads", grads, (ids.size, dim))
    s0, s1, s2 = _slot_ptrs(spec, slots, table.shape, "table")
    if spec.kind is OptKind.ADAM:
        lr = adam_lr_t(lr, spec.beta_1, spec.beta_2, C.positive_step(step))
    kernel = _N.cpu_sparse_update_unique if unique_ids else _N.cpu_sparse_update
    bad = kernel(
        spec.kind,
        lr,
        *spec.native_scalars,
        _ptr(table),
        rows,
        dim,
        _ptr(ids),
        ids.size,
        _ptr(grads),
        s0,
        s1,
        s2,
    )
    _raise_bad(bad, ids, rows)


class NativeCpuBackend(OpsBackend):
    """NumPy (and other host) arrays -> the C++/OpenMP kernels."""

    name = "native"
    embedding_lookup = staticmethod(embedding_lookup)
    sparse_aggregate = staticmethod(sparse_aggregate)
    dense_accumulate = staticmethod(dense_accumulate)
    dense_update = staticmethod(dense_update)
    sparse_update = staticmethod(sparse_update)
