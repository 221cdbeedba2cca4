"""Memory-bound kernels of the parameter server: embedding lookup, gradient
aggregation and optimizer updates, dense and sparse (by row id).

One signature per op. Each call dispatches on where its arrays live to one backend, an
implementation of :class:`~elasticdl.ops.interface.OpsBackend` (see :mod:`elasticdl.ops.interface`):

* NumPy (or anything ``np.asarray`` views, e.g. CPU torch tensors) -> the native C++/OpenMP
  kernels of ``elasticdl_native`` or, when that module is not importable, the NumPy
  reference in :mod:`elasticdl.ops.reference` (same results; slower).
* GPU arrays exposing ``__cuda_array_interface__`` (CuPy, PyTorch CUDA tensors) -> the CUDA
  kernels, zero-copy, when the native module was built with CUDA.

Optimizer updates come in two forms: :func:`dense_update` / :func:`sparse_update` take an
:class:`OptimizerSpec` built once (what the parameter server uses), and ``sgd``, ``adam``,
``sparse_adam``, ... take the hyperparameters as arguments. In-place ops (optimizers,
``dense_accumulate``) update their arrays and return None (``dense_accumulate`` returns
``out``). Bad input raises :class:`~elasticdl.ops.errors.OpsError`
(a ValueError) or :class:`~elasticdl.ops.errors.OpsTypeError` (a TypeError).
"""

from __future__ import annotations

import numpy as _np
from elasticdl.ops import _backend, _cuda
from elasticdl.ops import reference as _ref
from elasticdl.ops.errors import IdOutOfRangeError, OpsError, OpsTypeError
from elasticdl.ops.interface import SGD_SPEC as _SGD
from elasticdl.ops.interface import (
    OpsBackend,
    OptimizerSpec,
    OptKind,
    adagrad_spec,
    adam_spec,
    momentum_spec,
    register,
)

__all__ = [
    "IdOutOfRangeError",
    "OpsBackend",
    "OpsError",
    "OpsTypeError",
    "OptKind",
    "OptimizerSpec",
    "adagrad",
    "adam",
    "backend",
    "cuda_available",
    "dense_accumulate",
    "dense_update",
    "embedding_lookup",
    "momentum",
    "sgd",
    "sparse_adagrad",
    "sparse_adam",
    "sparse_aggregate",
    "sparse_momentum",
    "sparse_sgd",
    "sparse_update",
]

# The backends, registered explicitly. Host arrays go to the C++ kernels when the extension
# loaded, else to the NumPy reference; GPU arrays to the CUDA kernels.
_REFERENCE = register(_ref.ReferenceBackend())
if _backend.native is not None:
    from elasticdl.ops._native_cpu import NativeCpuBackend

    _CPU = register(NativeCpuBackend())
else:
    _CPU = _REFERENCE
_GPU = register(_cuda.CudaBackend())
_ndarray = _np.ndarray


def backend() -> str:
    """ "native" when the C++ extension serves CPU arrays, else "reference"."""
    return _CPU.name


def cuda_available() -> bool:
    """True when the extension was built with CUDA and a CUDA device is visible."""
    return _backend.cuda_built() and _backend.native.cuda_device_count() > 0


def _pick(a, b) -> OpsBackend:
    """The backend for a call on arrays a and b (the two that locate it)."""
    # NumPy arrays, the parameter server's case, are told apart by one type test each.
    if type(a) is _ndarray and type(b) is _ndarray:
        return _CPU
    return _GPU if _cuda.on_gpu(a) or _cuda.on_gpu(b) else _CPU


def embedding_lookup(table, ids, offsets=None, combiner=None, weights=None, out=None):
    """Rows ``table[ids]`` (shape (len(ids), dim), table dtype); with CSR ``offsets`` of length
    B+1 the rows of bag b = ids[offsets[b]:offsets[b+1]] are pooled by ``combiner`` in
    {"sum" (default), "mean", "sqrtn"}, optionally weighted per id -> float32 (B, dim).

    ``out``: optional preallocated C-contiguous, writeable result array of exactly that shape
    and dtype (on the same device); it is filled and returned. Reusing one buffer across calls
    skips the allocation and first-touch page faults of a fresh result (for 100k x 64 float32
    rows that is 25 MB of page faults per call)."""
    return _pick(table, ids).embedding_lookup(table, ids, offsets, combiner, weights, out)


def sparse_aggregate(ids, grads):
    """Sum gradient rows with equal ids -> (sorted unique int64 ids, float32 summed rows).

    Deterministic whatever the thread count. On the CPU the rows of one id are summed left to
    right (the same bits as the NumPy reference). On a GPU they are summed in chunks of
    ``elasticdl_native.CUDA_SUM_CHUNK`` (32) rows, one warp each, then the chunk sums left to
    right (:func:`elasticdl.ops.reference.sparse_aggregate_chunked`): the same bits as the CPU
    for ids seen at most 32 times, and a hot id is not one warp's serial loop. The sparse
    optimizers sum duplicates the same way before applying them."""
    return _pick(ids, grads).sparse_aggregate(ids, grads)


def dense_accumulate(out, grads_list_or_grad, scale=1.0):
    """``out += sum(grads) * scale`` in place (one pass over memory); returns ``out``."""
    g = grads_list_or_grad
    first = g[0] if isinstance(g, (list, tuple)) and g else g
    return _pick(out, first).dense_accumulate(out, g, scale)


def dense_update(spec: OptimizerSpec, param, grad, slots, lr, step=1):
    """One step of optimizer ``spec`` on ``param`` by ``grad``. ``slots``: the optimizer's state
    arrays shaped like ``param``, in the order of ``spec.slot_names`` (updated in place);
    ``step``: Adam's 1-based step count (ignored by the others)."""
    _pick(param, grad).dense_update(spec, param, grad, slots, lr, step)


def sparse_update(spec: OptimizerSpec, table, ids, grads, slots, lr, step=1, unique_ids=False):
    """One step of optimizer ``spec`` on rows ``ids`` of the 2-D ``table`` by ``grads`` (one row
    per id; duplicate ids are summed first, in order). ``slots`` are shaped like ``table``.

    ``unique_ids=True`` promises that no id repeats: the CPU kernel then updates each row
    straight from its gradient row, without ranking the ids (the parameter server passes it
    for ids it checked to be strictly increasing). The promise is not checked by the native
    kernel (the NumPy reference refuses repeated ids): with repeated ids the rows they name
    get an undefined update. Ids out of range are refused either way."""
    _pick(table, grads).sparse_update(spec, table, ids, grads, slots, lr, step, unique_ids)


def sgd(param, grad, lr):
    """``param -= lr * grad``."""
    _pick(param, grad).dense_update(_SGD, param, grad, (), lr, 1)


def momentum(param, grad, velocity, lr, momentum, nesterov=False):
    """``v = mu v + g``; ``p -= lr v`` (Nesterov: ``p -= lr (g + mu v)``)."""
    _pick(param, grad).dense_update(
        momentum_spec(momentum, nesterov), param, grad, (velocity,), lr, 1
    )


def adam(param, grad, m, v, lr, beta1, beta2, epsilon, step, amsgrad=False, max_v=None):
    """Keras-style Adam at 1-based ``step``: ``lr_t = lr sqrt(1-b2^t)/(1-b1^t)``,
    ``p -= lr_t m / (sqrt(v) + eps)``; AMSGrad uses ``max_v = max(max_v, v)`` instead of v."""
    _pick(param, grad).dense_update(
        adam_spec(beta1, beta2, epsilon, amsgrad),
        param,
        grad,
        (m, v, max_v) if amsgrad else (m, v),
        lr,
        step,
    )


def adagrad(param, grad, accumulator, lr, epsilon):
    """``acc += g^2``; ``p -= lr g / (sqrt(acc) + eps)``."""
    _pick(param, grad).dense_update(adagrad_spec(epsilon), param, grad, (accumulator,), lr, 1)


def sparse_sgd(table, ids, grads, lr):
    """SGD on rows ``ids`` of ``table``; duplicate ids accumulate (aggregated first)."""
    _pick(table, grads).sparse_update(_SGD, table, ids, grads, (), lr, 1)


def sparse_momentum(table, ids, grads, velocity, lr, momentum, nesterov=False):
    """Momentum on rows ``ids``; ``velocity`` has the table's shape."""
    _pick(table, grads).sparse_update(
        momentum_spec(momentum, nesterov), table, ids, grads, (velocity,), lr, 1
    )


def sparse_adam(
    table, ids, grads, m, v, lr, beta1, beta2, epsilon, step, amsgrad=False, max_v=None
):
    """Adam on rows ``ids`` (duplicates summed first); slots have the table's shape."""
    _pick(table, grads).sparse_update(
        adam_spec(beta1, beta2, epsilon, amsgrad),
        table,
        ids,
        grads,
        (m, v, max_v) if amsgrad else (m, v),
        lr,
        step,
    )


def sparse_adagrad(table, ids, grads, accumulator, lr, epsilon):
    """Adagrad on rows ``ids`` (duplicates summed first)."""
    _pick(table, grads).sparse_update(
        adagrad_spec(epsilon), table, ids, grads, (accumulator,), lr, 1
    )
