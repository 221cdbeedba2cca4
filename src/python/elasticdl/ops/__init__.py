"""Memory-bound kernels of the parameter server: embedding lookup, gradient
aggregation and optimizer updates, dense and sparse (by row id).

One signature per op. Each call dispatches on where its arrays live:

* NumPy (or anything ``np.asarray`` views, e.g. CPU torch tensors) -> the native C++/OpenMP
  kernels of ``elasticdl_native`` or, when that module is not importable, the NumPy
  reference in :mod:`elasticdl.ops.reference` (same results; slower).
* GPU arrays exposing ``__cuda_array_interface__`` (CuPy, PyTorch CUDA tensors) -> the CUDA
  kernels, zero-copy, when the native module was built with CUDA.

In-place ops (optimizers, ``dense_accumulate``) update their arrays and return None
(``dense_accumulate`` returns ``out``). Bad input raises :class:`~elasticdl.ops.errors.OpsError`
(a ValueError) or :class:`~elasticdl.ops.errors.OpsTypeError` (a TypeError).
"""

from __future__ import annotations

from elasticdl.ops import _backend, _cuda
from elasticdl.ops import reference as _ref
from elasticdl.ops.errors import IdOutOfRangeError, OpsError, OpsTypeError

__all__ = [
    "IdOutOfRangeError",
    "OpsError",
    "OpsTypeError",
    "adagrad",
    "adam",
    "backend",
    "cuda_available",
    "dense_accumulate",
    "embedding_lookup",
    "momentum",
    "sgd",
    "sparse_adagrad",
    "sparse_adam",
    "sparse_aggregate",
    "sparse_momentum",
    "sparse_sgd",
]


def backend() -> str:
    """ "native" when the C++ extension serves CPU arrays, else "reference"."""
    return _backend.name()


def cuda_available() -> bool:
    """True when the extension was built with CUDA and a CUDA device is visible."""
    return _backend.cuda_built() and _backend.native.cuda_device_count() > 0


def _cpu():
    if _backend.native is not None:
        from elasticdl.ops import _native_cpu

        return _native_cpu
    return _ref


def _impl(*arrays):
    if _cuda.any_on_gpu(arrays):
        return _cuda
    return _cpu()


def embedding_lookup(table, ids, offsets=None, combiner=None, weights=None, out=None):
    """Rows ``table[ids]`` (shape (len(ids), dim), table dtype); with CSR ``offsets`` of length
    B+1 the rows of bag b = ids[offsets[b]:offsets[b+1]] are pooled by ``combiner`` in
    {"sum" (default), "mean", "sqrtn"}, optionally weighted per id -> float32 (B, dim).

    ``out``: optional preallocated C-contiguous, writeable result array of exactly that shape
    and dtype (on the same device); it is filled and returned. Reusing one buffer across calls
    skips the allocation and first-touch page faults of a fresh result (for 100k x 64 float32
    rows that is 25 MB of page faults per call)."""
    return _impl(table, ids).embedding_lookup(table, ids, offsets, combiner, weights, out)


def sparse_aggregate(ids, grads):
    """Sum gradient rows with equal ids -> (sorted unique int64 ids, float32 summed rows).

    Deterministic whatever the thread count. On the CPU the rows of one id are summed left to
    right (the same bits as the NumPy reference). On a GPU they are summed in chunks of
    ``elasticdl_native.CUDA_SUM_CHUNK`` (32) rows, one warp each, then the chunk sums left to
    right (:func:`elasticdl.ops.reference.sparse_aggregate_chunked`): the same bits as the CPU
    for ids seen at most 32 times, and a hot id is not one warp's serial loop. The sparse
    optimizers sum duplicates the same way before applying them."""
    return _impl(ids, grads).sparse_aggregate(ids, grads)


def dense_accumulate(out, grads_list_or_grad, scale=1.0):
    """``out += sum(grads) * scale`` in place (one pass over memory); returns ``out``."""
    g = grads_list_or_grad
    first = g[0] if isinstance(g, (list, tuple)) and g else g
    return _impl(out, first).dense_accumulate(out, g, scale)


def sgd(param, grad, lr):
    """``param -= lr * grad``."""
    _impl(param, grad).sgd(param, grad, lr)


def momentum(param, grad, velocity, lr, momentum, nesterov=False):
    """``v = mu v + g``; ``p -= lr v`` (Nesterov: ``p -= lr (g + mu v)``)."""
    _impl(param, grad).momentum(param, grad, velocity, lr, momentum, nesterov)


def adam(param, grad, m, v, lr, beta1, beta2, epsilon, step, amsgrad=False, max_v=None):
    """Keras-style Adam at 1-based ``step``: ``lr_t = lr sqrt(1-b2^t)/(1-b1^t)``,
    ``p -= lr_t m / (sqrt(v) + eps)``; AMSGrad uses ``max_v = max(max_v, v)`` instead of v."""
    _impl(param, grad).adam(param, grad, m, v, lr, beta1, beta2, epsilon, step, amsgrad, max_v)


def adagrad(param, grad, accumulator, lr, epsilon):
    """``acc += g^2``; ``p -= lr g / (sqrt(acc) + eps)``."""
    _impl(param, grad).adagrad(param, grad, accumulator, lr, epsilon)


def sparse_sgd(table, ids, grads, lr):
    """SGD on rows ``ids`` of ``table``; duplicate ids accumulate (aggregated first)."""
    _impl(table, grads).sparse_sgd(table, ids, grads, lr)


def sparse_momentum(table, ids, grads, velocity, lr, momentum, nesterov=False):
    """Momentum on rows ``ids``; ``velocity`` has the table's shape."""
    _impl(table, grads).sparse_momentum(table, ids, grads, velocity, lr, momentum, nesterov)


def sparse_adam(
    table, ids, grads, m, v, lr, beta1, beta2, epsilon, step, amsgrad=False, max_v=None
):
    """Adam on rows ``ids`` (duplicates summed first); slots have the table's shape."""
    _impl(table, grads).sparse_adam(
        table, ids, grads, m, v, lr, beta1, beta2, epsilon, step, amsgrad, max_v
    )


def sparse_adagrad(table, ids, grads, accumulator, lr, epsilon):
    """Adagrad on rows ``ids`` (duplicates summed first)."""
    _impl(table, grads).sparse_adagrad(table, ids, grads, accumulator, lr, epsilon)
