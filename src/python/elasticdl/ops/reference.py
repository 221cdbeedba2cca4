"""Plain NumPy reference of every ``elasticdl.ops`` kernel.

This is the test oracle for the native CPU and CUDA kernels and the fallback
backend when the native extension is not importable (:class:`ReferenceBackend`). It
favours obviously-right code over speed, but follows the exact float32 operation order
of the native kernels (scalars rounded to float32, Adam's ``lr_t`` computed in double)
so the two agree bit for bit on element-wise updates.

Besides the interface (``dense_update``/``sparse_update`` with an
:class:`~elasticdl.ops.interface.OptimizerSpec`), the module has the per-optimizer functions
of :mod:`elasticdl.ops` with the same signatures (``sgd``, ``sparse_adam``, ...), so a test
can call either module the same way.
"""

from __future__ import annotations

import numpy as np
from elasticdl.ops import _checks as C
from elasticdl.ops.interface import (
    SGD_SPEC,
    OpsBackend,
    OptKind,
    adagrad_spec,
    adam_lr_t,
    adam_spec,
    momentum_spec,
    slot_count_error,
)

_F32 = np.float32


# --------------------------------------------------------------------------- lookup
def embedding_lookup(table, ids, offsets=None, combiner=None, weights=None, out=None):
    """Rows ``table[ids]``; with CSR ``offsets`` (len B+1) pool each bag with ``combiner``.

    Pooling follows TF's ``embedding_lookup_sparse``: sum = sum(w*e); mean = sum(w*e)/sum(w);
    sqrtn = sum(w*e)/sqrt(sum(w^2)); an empty bag (or zero weight sum) gives zeros. Gathered
    rows keep the table's dtype; pooled rows are float32. ``out``: optional result buffer.
    """
    table = C.table_2d("table", table)
    if table.dtype not in C.LOOKUP_DTYPES:
        raise C.OpsTypeError(
            f"table: expected one of {[str(d) for d in C.LOOKUP_DTYPES]}, got {table.dtype}"
        )
    ids = C.ids_int64(ids)
    comb = C.combiner_name(combiner, offsets)
    C.check_id_range(ids, table.shape[0])
    if comb is None:
        if weights is not None:
            raise C.OpsError("weights: only used when pooling bags; pass offsets and a combiner")
        if out is None:
            return table[ids]
        out = C.output_array("out", out, (ids.size, table.shape[1]), table.dtype)
        np.take(table, ids, axis=0, out=out)
        return out
    offs = C.offsets_int64(offsets, ids.size)
    w = None
    if weights is not None:
        w = C.float32_input("weights", weights, (ids.size,))
    rows = table[ids].astype(_F32)
    num_bags, dim = offs.size - 1, table.shape[1]
    if out is None:
        out = np.zeros((num_bags, dim), dtype=_F32)
    else:
        out = C.output_array("out", out, (num_bags, dim), _F32)
        out[...] = 0
    for b in range(num_bags):
        lo, hi = int(offs[b]), int(offs[b + 1])
        if hi == lo:
            continue
        if w is None:
            wb = np.ones(hi - lo, dtype=_F32)
        else:
            wb = w[lo:hi]
        acc = np.zeros(dim, dtype=_F32)
        for k in range(hi - lo):  # sequential order, like the native kernels
            acc += wb[k] * rows[lo + k]
        if comb == "mean":
            s = _F32(wb.sum(dtype=_F32))
            acc = acc / s if s != 0 else np.zeros(dim, _F32)
        elif comb == "sqrtn":
            s = _F32(np.sqrt((wb * wb).sum(dtype=_F32)))
            acc = acc / s if s != 0 else np.zeros(dim, _F32)
        out[b] = acc
    return out


# ---------------------------------------------------------------------- aggregation
def sparse_aggregate(ids, grads):
    """Sum rows of ``grads`` that share an id: returns (sorted unique ids, summed rows).

    Duplicates are summed in their original order (stable), so results are deterministic.
    """
    ids = C.ids_int64(ids)
    grads = C.float32_input("grads", grads)
    if grads.ndim != 2 or grads.shape[0] != ids.size:
        raise C.OpsError(f"grads: expected shape ({ids.size}, dim) to match ids, got {grads.shape}")
    uniq, inverse = np.unique(ids, return_inverse=True)
    out = np.zeros((uniq.size, grads.shape[1]), dtype=_F32)
    np.add.at(out, inverse, grads)
    return uniq, out


def sparse_aggregate_chunked(ids, grads, chunk):
    """:func:`sparse_aggregate` in the summation order of the CUDA kernels: the rows of each id
    summed left to right in chunks of ``chunk`` occurrences, then the chunk sums left to right.
    Equal to :func:`sparse_aggregate` for ids seen at most ``chunk`` times."""
    ids, grads = C.ids_int64(ids), C.float32_input("grads", grads)
    uniq, out = sparse_aggregate(ids, grads)  # checks the shapes; right for ids seen <= chunk times
    order = np.argsort(ids, kind="stable")
    starts = np.searchsorted(ids[order], uniq)
    ends = np.append(starts[1:], ids.size)
    for k in np.flatnonzero(ends - starts > chunk):
        rows = grads[order[starts[k] : ends[k]]]
        total = None
        for c in range(0, rows.shape[0], chunk):
            part = rows[c]
            for r in rows[c + 1 : c + chunk]:
                part = part + r
            total = part if total is None else total + part
        out[k] = total
    return uniq, out


def dense_accumulate(out, grads, scale=1.0):
    """``out += (g1 + g2 + ...) * scale`` in place; ``grads`` is one array or a list."""
    out = C.float32_inplace("out", out)
    glist = [grads] if not isinstance(grads, (list, tuple)) else list(grads)
    if not glist:
        return out
    gs = [C.float32_input(f"grads[{i}]", g, out.shape) for i, g in enumerate(glist)]
    total = gs[0].copy()
    for g in gs[1:]:
        total += g
    if scale != 1.0:
        total *= _F32(scale)
    out += total
    return out


# ------------------------------------------------------------ element-wise updates
# Each ``_*_rows`` works on matching float32 arrays (rows of a table or a whole param)
# and is shared by the dense and sparse updates.
def _sgd_rows(p, g, lr):
    p -= _F32(lr) * g


def _momentum_rows(p, g, v, lr, mu, nesterov):
    lr, mu = _F32(lr), _F32(mu)
    v *= mu
    v += g
    if nesterov:
        p -= lr * (g + mu * v)
    else:
        p -= lr * v


def _adam_rows(p, g, m, v, lr_t, b1, b2, eps, max_v):
    b1, b2, eps, lr_t = _F32(b1), _F32(b2), _F32(eps), _F32(lr_t)
    m *= b1
    m += (_F32(1) - b1) * g
    v *= b2
    v += (_F32(1) - b2) * (g * g)
    if max_v is not None:
        np.maximum(max_v, v, out=max_v)
        denom = np.sqrt(max_v) + eps
    else:
        denom = np.sqrt(v) + eps
    p -= lr_t * m / denom


def _adagrad_rows(p, g, acc, lr, eps):
    acc += g * g
    p -= _F32(lr) * g / (np.sqrt(acc) + _F32(eps))


def _apply_rows(spec, p, g, slots, lr, step):
    """The update of ``spec`` on rows ``p`` by gradient rows ``g``; ``slots`` match ``p``."""
    kind = spec.kind
    if kind is OptKind.SGD:
        _sgd_rows(p, g, lr)
    elif kind is OptKind.MOMENTUM:
        _momentum_rows(p, g, slots[0], lr, spec.momentum, spec.nesterov)
    elif kind is OptKind.ADAM:
        lr_t = adam_lr_t(lr, spec.beta_1, spec.beta_2, step)
        max_v = slots[2] if spec.amsgrad else None
        _adam_rows(p, g, slots[0], slots[1], lr_t, spec.beta_1, spec.beta_2, spec.epsilon, max_v)
    else:
        _adagrad_rows(p, g, slots[0], lr, spec.epsilon)


def _slot_arrays(spec, slots, shape, like):
    names = spec.slot_args
    if len(slots) != len(names) or any(s is None for s in slots):
        raise slot_count_error(spec, slots, like)
    return [C.float32_inplace(n, s, shape) for n, s in zip(names, slots)]


def dense_update(spec, param, grad, slots, lr, step=1):
    """One step of optimizer ``spec`` on ``param`` (see :class:`OpsBackend`)."""
    param = C.float32_inplace("param", param)
    grad = C.float32_input("grad", grad, param.shape)
    s = _slot_arrays(spec, slots, param.shape, "param")
    if spec.kind is OptKind.ADAM:
        step = C.positive_step(step)
    _apply_rows(spec, param, grad, s, lr, step)


def sparse_update(spec, table, ids, grads, slots, lr, step=1, unique_ids=False):
    """One step of optimizer ``spec`` on rows ``ids`` of ``table``: duplicates are summed
    (:func:`sparse_aggregate`), then each unique row is updated once. ``unique_ids=True``: the
    rows are updated in the given order without summing, after checking that none repeats
    (the oracle holds callers to the promise the native kernel trusts)."""
    table = C.float32_inplace("table", table)
    if table.ndim != 2:
        raise C.OpsError(f"table: expected a 2-D (rows, dim) table, got shape {table.shape}")
    ids = C.ids_int64(ids)
    grads = C.float32_input("grads", grads, (ids.size, table.shape[1]))
    s = _slot_arrays(spec, slots, table.shape, "table")
    C.check_id_range(ids, table.shape[0])
    if spec.kind is OptKind.ADAM:
        step = C.positive_step(step)
    if unique_ids:
        if np.unique(ids).size != ids.size:
            raise C.OpsError("ids: unique_ids=True but some id repeats")
        uniq, g = ids, grads
    else:
        uniq, g = sparse_aggregate(ids, grads)
    p, rows = table[uniq], [x[uniq] for x in s]
    _apply_rows(spec, p, g, rows, lr, step)
    table[uniq] = p
    for x, r in zip(s, rows):
        x[uniq] = r


class ReferenceBackend(OpsBackend):
    """The NumPy oracle as an :class:`~elasticdl.ops.interface.OpsBackend`."""

    name = "reference"
    embedding_lookup = staticmethod(embedding_lookup)
    sparse_aggregate = staticmethod(sparse_aggregate)
    dense_accumulate = staticmethod(dense_accumulate)
    dense_update = staticmethod(dense_update)
    sparse_update = staticmethod(sparse_update)


# ------------------------------------------- the per-optimizer functions of elasticdl.ops
def sgd(param, grad, lr):
    dense_update(SGD_SPEC, param, grad, (), lr)


def momentum(param, grad, velocity, lr, momentum, nesterov=False):
    dense_update(momentum_spec(momentum, nesterov), param, grad, (velocity,), lr)


def adam(param, grad, m, v, lr, beta1, beta2, epsilon, step, amsgrad=False, max_v=None):
    slots = (m, v, max_v) if amsgrad else (m, v)
    dense_update(adam_spec(beta1, beta2, epsilon, amsgrad), param, grad, slots, lr, step)


def adagrad(param, grad, accumulator, lr, epsilon):
    dense_update(adagrad_spec(epsilon), param, grad, (accumulator,), lr)


def sparse_sgd(table, ids, grads, lr):
    sparse_update(SGD_SPEC, table, ids, grads, (), lr)


def sparse_momentum(table, ids, grads, velocity, lr, momentum, nesterov=False):
    sparse_update(momentum_spec(momentum, nesterov), table, ids, grads, (velocity,), lr)


def sparse_adam(
    table, ids, grads, m, v, lr, beta1, beta2, epsilon, step, amsgrad=False, max_v=None
):
    slots = (m, v, max_v) if amsgrad else (m, v)
    sparse_update(adam_spec(beta1, beta2, epsilon, amsgrad), table, ids, grads, slots, lr, step)


def sparse_adagrad(table, ids, grads, accumulator, lr, epsilon):
    sparse_update(adagrad_spec(epsilon), table, ids, grads, (accumulator,), lr)
