"""Argument checks shared by the NumPy reference and the native CPU backend.

They run in O(1) or O(len(ids)) NumPy time so that native kernels only ever see
well-formed, contiguous buffers (the native code re-checks ids while it works,
because that pass is free there).
"""

from __future__ import annotations

import numpy as np
from elasticdl.ops.errors import IdOutOfRangeError, OpsError, OpsTypeError

COMBINERS = ("sum", "mean", "sqrtn")

try:  # bfloat16 NumPy dtype (ships with TensorFlow/JAX); optional.
    import ml_dtypes as _ml_dtypes

    BFLOAT16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - only without ml_dtypes
    BFLOAT16 = None

LOOKUP_DTYPES = tuple(
    d for d in (np.dtype(np.float32), np.dtype(np.float16), BFLOAT16) if d is not None
)


def as_ndarray(name: str, x) -> np.ndarray:
    """Return ``x`` as a NumPy array without copying array-likes that share memory."""
    if isinstance(x, np.ndarray):
        return x
    try:
        return np.asarray(x)
    except Exception as e:  # torch tensors that need grad, ragged lists, ...
        raise OpsTypeError(f"{name}: cannot be viewed as a NumPy array ({e})") from None


def ids_int64(ids, name: str = "ids") -> np.ndarray:
    """1-D contiguous int64 ids; int32 (and other integer) ids are converted."""
    a = as_ndarray(name, ids)
    if a.ndim != 1:
        raise OpsError(f"{name}: expected a 1-D array of ids, got shape {a.shape}")
    if a.dtype != np.int64:
        if a.dtype.kind not in "iu" and a.size:
            raise OpsTypeError(f"{name}: expected integer ids (int64 or int32), got {a.dtype}")
        if a.dtype == np.uint64 and a.size and int(a.max()) > np.iinfo(np.int64).max:
            raise OpsError(f"{name}: uint64 ids above 2**63-1 are not supported")
        a = a.astype(np.int64)
    return np.ascontiguousarray(a)


def float32_input(name: str, x, shape=None) -> np.ndarray:
    """A float32 array that is only read (made contiguous if needed)."""
    a = as_ndarray(name, x)
    if a.dtype != np.float32:
        raise OpsTypeError(
            f"{name}: expected float32, got {a.dtype}; cast with .astype(np.float32)"
        )
    if shape is not None and a.shape != tuple(shape):
        raise OpsError(f"{name}: expected shape {tuple(shape)}, got {a.shape}")
    return np.ascontiguousarray(a)


def float32_inplace(name: str, x, shape=None) -> np.ndarray:
    """A float32 array updated in place: must be a C-contiguous, writeable ndarray."""
    if not isinstance(x, np.ndarray):
        # e.g. a CPU torch tensor: np.asarray views its memory; a fresh copy would
        # silently swallow the update, so refuse it.
        a = as_ndarray(name, x)
        if a.flags.owndata:
            raise OpsTypeError(
                f"{name}: updated in place, so it must be a NumPy array (or share memory with one); "
                f"got {type(x).__name__}"
            )
        x = a
    if x.dtype != np.float32:
        raise OpsTypeError(f"{name}: expected float32 for an in-place update, got {x.dtype}")
    if shape is not None and x.shape != tuple(shape):
        raise OpsError(f"{name}: expected shape {tuple(shape)}, got {x.shape}")
    if not x.flags.c_contiguous:
        raise OpsError(
            f"{name}: updated in place, so it must be C-contiguous; pass np.ascontiguousarray(...) "
            "and keep that array"
        )
    if not x.flags.writeable:
        raise OpsError(f"{name}: updated in place, but the array is read-only")
    return x


def output_array(name: str, x, shape, dtype) -> np.ndarray:
    """A caller-provided result buffer: a C-contiguous, writeable ndarray of exactly `shape`/`dtype`."""
    if not isinstance(x, np.ndarray):
        raise OpsTypeError(
            f"{name}: expected a NumPy array to write the result into, got {type(x).__name__}"
        )
    if x.dtype != dtype:
        raise OpsTypeError(
            f"{name}: expected dtype {np.dtype(dtype)} (the result's), got {x.dtype}"
        )
    if x.shape != tuple(shape):
        raise OpsError(f"{name}: expected shape {tuple(shape)}, got {x.shape}")
    if not x.flags.c_contiguous:
        raise OpsError(
            f"{name}: the result buffer must be C-contiguous; allocate it with np.empty({tuple(shape)})"
        )
    if not x.flags.writeable:
        raise OpsError(f"{name}: the result buffer is read-only")
    return x


def table_2d(name: str, table) -> np.ndarray:
    a = as_ndarray(name, table)
    if a.ndim != 2:
        raise OpsError(f"{name}: expected a 2-D (rows, dim) table, got shape {a.shape}")
    return a


def check_id_range(ids: np.ndarray, num_rows: int) -> None:
    """Raise IdOutOfRangeError naming the first id outside [0, num_rows)."""
    if ids.size == 0:
        return
    bad = (ids < 0) | (ids >= num_rows)
    if bad.any():
        pos = int(np.argmax(bad))
        raise IdOutOfRangeError(pos, int(ids[pos]), num_rows)


def offsets_int64(offsets, num_ids: int) -> np.ndarray:
    """CSR bag offsets: int64, length B+1, starting at 0, non-decreasing, ending at len(ids)."""
    o = ids_int64(offsets, "offsets")
    if o.size == 0:
        raise OpsError("offsets: expected B+1 entries (at least [0]), got an empty array")
    if o[0] != 0:
        raise OpsError(f"offsets: must start at 0, got offsets[0] = {int(o[0])}")
    if o[-1] != num_ids:
        raise OpsError(f"offsets: must end at len(ids) = {num_ids}, got offsets[-1] = {int(o[-1])}")
    if o.size > 1 and (np.diff(o) < 0).any():
        pos = int(np.argmax(np.diff(o) < 0))
        raise OpsError(f"offsets: must be non-decreasing, but offsets[{pos + 1}] < offsets[{pos}]")
    return o


def combiner_name(combiner, offsets) -> str | None:
    if offsets is None:
        if combiner is not None:
            raise OpsError(
                "combiner: needs offsets (bags); pass offsets=[0, ..., len(ids)] or combiner=None"
            )
        return None
    if combiner is None:
        return "sum"
    if combiner not in COMBINERS:
        raise OpsError(f"combiner: expected one of {COMBINERS}, got {combiner!r}")
    return combiner


def positive_step(step) -> int:
    s = int(step)
    if s < 1:
        raise OpsError(f"step: Adam's step count starts at 1, got {step}")
    return s
