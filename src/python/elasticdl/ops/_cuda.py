"""GPU arrays (``__cuda_array_interface__``: CuPy, PyTorch CUDA tensors) -> CUDA kernels
(:class:`CudaBackend`).

Zero-copy: kernels read and write the caller's device memory. They run on the legacy
default stream, which orders itself after work queued on the frameworks' ordinary (blocking)
streams. Host arrays mixed into a GPU call (e.g. NumPy ids) are copied to the device with
the framework of the GPU array; arrays updated in place must already be on the device.
"""

from __future__ import annotations

import math

import numpy as np
from elasticdl.ops import _backend
from elasticdl.ops import _checks as C
from elasticdl.ops.errors import IdOutOfRangeError, OpsError, OpsTypeError
from elasticdl.ops.interface import OpsBackend, OptKind, adam_lr_t, slot_count_error

COMBINER_CODE = {"sum": 0, "mean": 1, "sqrtn": 2}
_DTYPE_CODE = {"<f4": 0, "<f2": 1}


def on_gpu(x) -> bool:
    """Whether x is a GPU array (torch's ``is_cuda`` is an attribute read; asking torch for
    ``__cuda_array_interface__`` builds the whole dict)."""
    module = type(x).__module__
    if module.startswith("torch"):
        return bool(getattr(x, "is_cuda", False))
    if module.startswith("cupy"):
        return True
    return hasattr(x, "__cuda_array_interface__")


def _native():
    if not _backend.cuda_built():
        raise OpsError(
            "GPU arrays were passed but elasticdl_native was built without CUDA "
            f"(backend: {_backend.name()}); rebuild src/cc with nvcc available, or pass NumPy arrays"
        )
    return _backend.native


class _Dev:
    """A view of one GPU array: address, shape, dtype string, contiguity, framework.

    PyTorch tensors and CuPy arrays are read through their own attributes: torch builds its
    ``__cuda_array_interface__`` dict in Python on every access, a cost every array of every
    call would pay; other arrays go through the interface."""

    def __init__(self, name: str, x):
        self.obj = x
        self.name = name
        self.framework = type(x).__module__.split(".")[0]
        self.readonly = False
        if self.framework == "torch":
            self.shape = tuple(x.shape)
            self.typestr = _torch_typestr(x.dtype)
            self.ptr = int(x.data_ptr())
            self.contiguous = bool(x.is_contiguous())
        elif self.framework == "cupy":
            self.shape = tuple(x.shape)
            self.typestr = x.dtype.str
            self.ptr = int(x.data.ptr)
            self.contiguous = bool(x.flags.c_contiguous)
        else:
            cai = x.__cuda_array_interface__
            self.shape = tuple(int(s) for s in cai["shape"])
            self.typestr = cai["typestr"]
            self.ptr, self.readonly = int(cai["data"][0]), bool(cai["data"][1])
            strides = cai.get("strides")
            itemsize = int(self.typestr[2:])
            self.contiguous = strides is None or tuple(strides) == _c_strides(self.shape, itemsize)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


_TORCH_TYPESTR = {}


def _torch_typestr(dtype) -> str:
    """The array-interface typestr of a torch dtype (its name where there is none: bfloat16)."""
    if not _TORCH_TYPESTR:
        import torch

        for name, ts in (
            ("float32", "<f4"),
            ("float16", "<f2"),
            ("float64", "<f8"),
            ("int64", "<i8"),
            ("int32", "<i4"),
            ("int16", "<i2"),
            ("int8", "|i1"),
            ("uint8", "|u1"),
            ("bool", "|b1"),
        ):
            _TORCH_TYPESTR[getattr(torch, name)] = ts
    return _TORCH_TYPESTR.get(dtype, str(dtype))


def _c_strides(shape, itemsize):
    out, acc = [], itemsize
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def _framework_of(x):
    mod = type(x).__module__.split(".")[0]
    if mod == "cupy":
        import cupy

        return "cupy", cupy
    if mod == "torch":
        import torch

        return "torch", torch
    raise OpsTypeError(
        f"unsupported GPU array type {type(x).__name__}; use CuPy arrays or PyTorch tensors"
    )


def _to_device(like, x, dtype: str):
    """x (host or device) as a contiguous device array of `dtype` next to `like`."""
    kind, fw = _framework_of(like)
    if kind == "cupy":
        with fw.cuda.Device(like.device.id):
            return fw.ascontiguousarray(fw.asarray(x, dtype=dtype))
    t = fw.as_tensor(x, device=like.device)
    return t.to(getattr(fw, dtype)).contiguous()


def _empty(like, shape, dtype: str):
    kind, fw = _framework_of(like)
    if kind == "cupy":
        with fw.cuda.Device(like.device.id):
            return fw.empty(shape, dtype=dtype)
    return fw.empty(shape, dtype=getattr(fw, dtype), device=like.device)


def _input(name, like, x, typestr_want, dtype_name, shape=None) -> _Dev:
    if not on_gpu(x):
        x = _to_device(like, np.asarray(x), dtype_name)
    d = _Dev(name, x)
    if d.typestr != typestr_want:
        if dtype_name == "int64" and d.typestr in ("<i4", "<i8", "<u4"):
            d = _Dev(name, _to_device(like, x, "int64"))
        else:
            raise OpsTypeError(f"{name}: expected {dtype_name}, got typestr {d.typestr}")
    if shape is not None and d.shape != tuple(shape):
        raise OpsError(f"{name}: expected shape {tuple(shape)}, got {d.shape}")
    if not d.contiguous:
        d = _Dev(name, _to_device(like, x, dtype_name))
    return d


def _inplace(name, x, shape=None) -> _Dev:
    if not on_gpu(x):
        raise OpsError(
            f"{name}: updated in place on the GPU, so it must be a GPU array like the others"
        )
    d = _Dev(name, x)
    if d.typestr != "<f4":
        raise OpsTypeError(
            f"{name}: expected float32 for an in-place update, got typestr {d.typestr}"
        )
    if shape is not None and d.shape != tuple(shape):
        raise OpsError(f"{name}: expected shape {tuple(shape)}, got {d.shape}")
    if not d.contiguous:
        raise OpsError(f"{name}: updated in place, so it must be C-contiguous")
    if d.readonly:
        raise OpsError(f"{name}: updated in place, but the array is read-only")
    return d


def _bad(pos, ids: _Dev, rows):
    if pos >= 0:
        value = int(np.asarray(_host(ids.obj[pos : pos + 1]))[0])
        raise IdOutOfRangeError(pos, value, rows)


def _host(x):
    return x.get() if hasattr(x, "get") else x.cpu().numpy()


def _output(name, like, out, shape, typestr, dtype_name) -> _Dev:
    """The caller's result buffer on the GPU, or a new one next to `like` (``.obj``)."""
    if out is None:
        return _Dev(name, _empty(like, shape, dtype_name))
    d = _inplace(name, out, shape) if typestr == "<f4" else _Dev(name, out)
    if d.typestr != typestr:
        raise OpsTypeError(
            f"{name}: expected {dtype_name} (the result's dtype), got typestr {d.typestr}"
        )
    if d.shape != tuple(shape) or not d.contiguous or d.readonly:
        raise OpsError(
            f"{name}: expected a writeable C-contiguous GPU array of shape {tuple(shape)}"
        )
    return d


def embedding_lookup(table, ids, offsets=None, combiner=None, weights=None, out=None):
    N = _native()
    t = _Dev("table", table)
    if len(t.shape) != 2:
        raise OpsError(f"table: expected a 2-D (rows, dim) table, got shape {t.shape}")
    if t.typestr not in _DTYPE_CODE:
        raise OpsTypeError(
            f"table: GPU lookup supports float32/float16 tables, got typestr {t.typestr}"
        )
    if not t.contiguous:
        raise OpsError("table: must be C-contiguous")
    rows, dim = t.shape
    i = _input("ids", table, ids, "<i8", "int64")
    if len(i.shape) != 1:
        raise OpsError(f"ids: expected a 1-D array of ids, got shape {i.shape}")
    comb = C.combiner_name(combiner, offsets)
    if comb is None:
        if weights is not None:
            raise OpsError("weights: only used when pooling bags; pass offsets and a combiner")
        half = t.typestr != "<f4"
        o = _output("out", table, out, (i.size, dim), t.typestr, "float16" if half else "float32")
        _bad(N.cuda_lookup(t.ptr, _DTYPE_CODE[t.typestr], rows, dim, i.ptr, i.size, o.ptr), i, rows)
        return o.obj
    # Offsets are validated on the host (B+1 integers): a bad bag layout would read out of bounds.
    offs_host = C.offsets_int64(_host(offsets) if on_gpu(offsets) else offsets, i.size)
    o = _input("offsets", table, offs_host, "<i8", "int64")
    w = (
        _input("weights", table, weights, "<f4", "float32", (i.size,))
        if weights is not None
        else None
    )
    res = _output("out", table, out, (offs_host.size - 1, dim), "<f4", "float32")
    bad = N.cuda_lookup_pooled(
        t.ptr,
        _DTYPE_CODE[t.typestr],
        rows,
        dim,
        i.ptr,
        i.size,
        o.ptr,
        offs_host.size - 1,
        w.ptr if w is not None else 0,
        COMBINER_CODE[comb],
        res.ptr,
    )
    _bad(bad, i, rows)
    return res.obj


def sparse_aggregate(ids, grads):
    N = _native()
    like = grads if on_gpu(grads) else ids
    i = _input("ids", like, ids, "<i8", "int64")
    g = _input("grads", like, grads, "<f4", "float32")
    if len(g.shape) != 2 or g.shape[0] != i.size:
        raise OpsError(f"grads: expected shape ({i.size}, dim) to match ids, got {g.shape}")
    dim = g.shape[1]
    out_ids = _empty(like, (i.size,), "int64")
    out = _empty(like, (i.size, dim), "float32")
    u = N.cuda_aggregate(
        i.ptr, i.size, g.ptr, dim, _Dev("out_ids", out_ids).ptr, _Dev("out", out).ptr
    )
    return out_ids[:u], out[:u]


def dense_accumulate(out, grads, scale=1.0):
    N = _native()
    o = _inplace("out", out)
    glist = [grads] if not isinstance(grads, (list, tuple)) else list(grads)
    gs = [_input(f"grads[{k}]", out, g, "<f4", "float32", o.shape) for k, g in enumerate(glist)]
    if gs:
        N.cuda_dense_accumulate(o.ptr, [g.ptr for g in gs], o.size, float(scale))
    return out


def _slot_ptrs(spec, slots, shape, like):
    """Device addresses of the slot arrays (0 for unused ones), checked like the parameter."""
    names = spec.slot_args
    if len(slots) != len(names):
        raise slot_count_error(spec, slots, like)
    ptrs = [0, 0, 0]
    for k, s in enumerate(slots):
        if s is None:
            raise slot_count_error(spec, slots, like)
        ptrs[k] = _inplace(names[k], s, shape).ptr
    return ptrs


def dense_update(spec, param, grad, slots, lr, step=1):
    N = _native()
    p = _inplace("param", param)
    g = _input("grad", param, grad, "<f4", "float32", p.shape)
    s0, s1, s2 = _slot_ptrs(spec, slots, p.shape, "param")
    if spec.kind is OptKind.ADAM:
        lr = adam_lr_t(lr, spec.beta_1, spec.beta_2, C.positive_step(step))
    N.cuda_dense_update(spec.kind, lr, *spec.native_scalars, p.ptr, g.ptr, s0, s1, s2, p.size)


def sparse_update(spec, table, ids, grads, slots, lr, step=1, unique_ids=False):
    # unique_ids is a hint the CUDA kernel does not use: it always sums (unique ids are summed
    # to themselves).
    N = _native()
    t = _inplace("table", table)
    if len(t.shape) != 2:
        raise OpsError(f"table: expected a 2-D (rows, dim) table, got shape {t.shape}")
    rows, dim = t.shape
    i = _input("ids", table, ids, "<i8", "int64")
    g = _input("grads", table, grads, "<f4", "float32", (i.size, dim))
    s0, s1, s2 = _slot_ptrs(spec, slots, t.shape, "table")
    if spec.kind is OptKind.ADAM:
        lr = adam_lr_t(lr, spec.beta_1, spec.beta_2, C.positive_step(step))
    bad = N.cuda_sparse_update(
        spec.kind, lr, *spec.native_scalars, t.ptr, rows, dim, i.ptr, i.size, g.ptr, s0, s1, s2
    )
    _bad(bad, i, rows)


class CudaBackend(OpsBackend):
    """GPU arrays -> the CUDA kernels (an OpsError when the extension has none)."""

    name = "cuda"
    # The functions reach the extension and on_gpu through this module's globals, so a test
    # without a GPU can stand in for both by patching the module (cuda_glue_test.py).
    embedding_lookup = staticmethod(embedding_lookup)
    sparse_aggregate = staticmethod(sparse_aggregate)
    dense_accumulate = staticmethod(dense_accumulate)
    dense_update = staticmethod(dense_update)
    sparse_update = staticmethod(sparse_update)
