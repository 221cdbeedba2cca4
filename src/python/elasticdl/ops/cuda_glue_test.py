"""The GPU path's Python glue (``elasticdl.ops._cuda``) without a GPU.

CI has no GPU, so these tests stand one in: torch CPU tensors play the GPU arrays (``on_gpu``
is patched to say so) and a stand-in native module serves the ``cuda_*`` entry points with the
CPU kernels, which take the same arguments (raw addresses of host memory here). What runs for
real is everything between the public API and the native call: dispatch, dtype conversion of
host ids, shape/layout checks, pointers, result allocation and out-of-range errors. The CUDA
kernels themselves are tested in cuda_test.py, on a GPU.
"""

import ctypes

import elasticdl.ops as ops
import numpy as np
import pytest
from elasticdl.ops import _backend, _cuda
from elasticdl.ops import interface as B
from elasticdl.ops import reference as R

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(_backend.native is None, reason="needs the native CPU kernels")


def _floats(ptr, n):
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr))


class _CpuAsCuda:
    """``cuda_*`` entry points served by the CPU kernels; records each call's name."""

    def __init__(self):
        self.calls = []
        self.CUDA_SUM_CHUNK = _backend.native.CUDA_SUM_CHUNK

    def __getattr__(self, name):
        if not name.startswith("cuda_"):
            raise AttributeError(name)
        cpu = getattr(_backend.native, "cpu_" + name[len("cuda_") :])

        def call(*args):
            self.calls.append(name)
            return cpu(*args)

        return call

    def cuda_aggregate(self, ids_ptr, n, grads_ptr, dim, out_ids_ptr, out_ptr):
        # Same contract as the CUDA kernel: results written into caller buffers of n rows.
        self.calls.append("cuda_aggregate")
        ids = np.ctypeslib.as_array((ctypes.c_int64 * n).from_address(ids_ptr)).copy()
        grads = _floats(grads_ptr, n * dim).reshape(n, dim).copy()
        u, g = R.sparse_aggregate_chunked(ids, grads, self.CUDA_SUM_CHUNK)
        np.ctypeslib.as_array((ctypes.c_int64 * n).from_address(out_ids_ptr))[: u.size] = u
        _floats(out_ptr, n * dim).reshape(n, dim)[: u.size] = g
        return u.size


@pytest.fixture
def fake_gpu(monkeypatch):
    native = _CpuAsCuda()
    monkeypatch.setattr(_cuda, "_native", lambda: native)
    monkeypatch.setattr(_cuda, "on_gpu", lambda x: isinstance(x, torch.Tensor))
    return native


def _table(rows=50, dim=16, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((rows, dim), np.float32))


def test_lookup_into_a_new_result_and_into_out(fake_gpu):
    table = _table()
    ids = np.array([3, 0, 49, 3])  # host ids are moved next to the table, as int64
    got = ops.embedding_lookup(table, ids.astype(np.int32))
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    np.testing.assert_array_equal(got.numpy(), table.numpy()[ids])
    out = torch.empty(4, 16)
    assert ops.embedding_lookup(table, torch.from_numpy(ids), out=out) is out
    np.testing.assert_array_equal(out.numpy(), table.numpy()[ids])
    assert fake_gpu.calls == ["cuda_lookup", "cuda_lookup"]


def test_half_table_lookup_and_pooling(fake_gpu):
    table = _table().to(torch.float16)
    ids = torch.tensor([1, 2, 2, 7])
    np.testing.assert_array_equal(
        ops.embedding_lookup(table, ids).numpy(), table.numpy()[[1, 2, 2, 7]]
    )
    offsets = np.array([0, 3, 4])
    pooled = ops.embedding_lookup(table, ids, torch.from_numpy(offsets), "mean")
    np.testing.assert_allclose(
        pooled.numpy(), R.embedding_lookup(table.numpy(), ids.numpy(), offsets, "mean"), rtol=1e-6
    )
    assert fake_gpu.calls == ["cuda_lookup", "cuda_lookup_pooled"]


def test_bad_layouts_and_ids_are_clear_errors(fake_gpu):
    table = _table()
    with pytest.raises(ops.IdOutOfRangeError, match=r"ids\[1\] = 50 .* 50 rows"):
        ops.embedding_lookup(table, torch.tensor([0, 50]))
    with pytest.raises(ops.OpsError, match="C-contiguous"):
        ops.embedding_lookup(table[:, ::2], torch.tensor([0]))
    with pytest.raises(ops.OpsError, match=r"out: expected shape \(2, 16\), got \(3, 16\)"):
        ops.embedding_lookup(table, torch.tensor([0, 1]), out=torch.empty(3, 16))
    with pytest.raises(ops.OpsTypeError, match="float32"):
        ops.sparse_sgd(table.double(), torch.tensor([0]), torch.ones(1, 16), 0.1)
    with pytest.raises(ValueError, match=r"ids\[0\] = -2"):
        ops.sparse_sgd(table, torch.tensor([-2]), torch.ones(1, 16), 0.1)


def test_sparse_and_dense_updates_reach_the_kernels(fake_gpu):
    table, ref = _table(), _table().numpy()
    m, v = torch.zeros_like(table), torch.zeros_like(table)
    rm, rv = np.zeros_like(ref), np.zeros_like(ref)
    ids = np.array([4, 9, 4, 0])
    grads = np.random.default_rng(1).standard_normal((4, 16), np.float32)
    ops.sparse_adam(table, ids, torch.from_numpy(grads), m, v, 0.01, 0.9, 0.999, 1e-7, 1)
    R.sparse_adam(ref, ids, grads, rm, rv, 0.01, 0.9, 0.999, 1e-7, 1)
    np.testing.assert_array_equal(table.numpy(), ref)
    np.testing.assert_array_equal(m.numpy(), rm)
    ops.sgd(table, torch.ones_like(table), 0.5)
    np.testing.assert_array_equal(table.numpy(), ref - np.float32(0.5))
    assert fake_gpu.calls == ["cuda_sparse_update", "cuda_dense_update"]


@pytest.mark.parametrize(
    "spec",
    [
        B.OptimizerSpec("sgd"),
        B.OptimizerSpec("momentum", momentum=0.9, nesterov=True),
        B.OptimizerSpec("adam", amsgrad=True),
        B.OptimizerSpec("adagrad"),
    ],
    ids=lambda s: s.kind.label,
)
def test_every_optimizer_kind_through_the_interface(fake_gpu, spec):
    """The registered CUDA backend takes the same spec and slots as the reference."""
    cuda, k = B.get("cuda"), len(spec.slot_names)
    table, ref = _table(), _table().numpy()
    slots = [torch.full_like(table, 0.5) for _ in range(k)]
    ref_slots = [np.full_like(ref, 0.5) for _ in range(k)]
    ids = np.array([4, 9, 4, 0])
    grads = np.random.default_rng(2).standard_normal((4, 16), np.float32)
    cuda.sparse_update(spec, table, ids, torch.from_numpy(grads), slots, 0.1, 2)
    R.sparse_update(spec, ref, ids, grads, ref_slots, 0.1, 2)
    g = np.ones_like(ref)
    cuda.dense_update(spec, table, torch.from_numpy(g), slots, 0.1, 3)
    R.dense_update(spec, ref, g, ref_slots, 0.1, 3)
    np.testing.assert_array_equal(table.numpy(), ref)
    for a, b in zip(slots, ref_slots):
        np.testing.assert_array_equal(a.numpy(), b)
    assert fake_gpu.calls == ["cuda_sparse_update", "cuda_dense_update"]


def test_aggregate_returns_views_of_the_unique_rows(fake_gpu):
    ids = torch.tensor([5, 1, 5, 5, 2])
    grads = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    u, g = ops.sparse_aggregate(ids, grads)
    np.testing.assert_array_equal(u.numpy(), [1, 2, 5])
    np.testing.assert_array_equal(g.numpy(), [[2, 3], [8, 9], [0 + 4 + 6, 1 + 5 + 7]])


def test_gpu_views_read_framework_attributes():
    """A torch tensor is read through its attributes, not torch's __cuda_array_interface__
    (built in Python on every access); a foreign array through the interface."""
    t = torch.zeros(6, 8)
    d = _cuda._Dev("x", t[:, ::2])
    assert (d.shape, d.typestr, d.contiguous, d.ptr) == ((6, 4), "<f4", False, t.data_ptr())
    assert _cuda._Dev("y", torch.zeros(3, dtype=torch.bfloat16)).typestr == "torch.bfloat16"

    class Foreign:
        __cuda_array_interface__ = {
            "shape": (2, 3),
            "typestr": "<i8",
            "data": (4096, True),
            "strides": (24, 8),
            "version": 3,
        }

    f = _cuda._Dev("z", Foreign())
    assert (f.shape, f.typestr, f.ptr, f.readonly, f.contiguous, f.size) == (
        (2, 3),
        "<i8",
        4096,
        True,
        True,
        6,
    )
    assert _cuda.on_gpu(Foreign()) and not _cuda.on_gpu(t) and not _cuda.on_gpu(np.zeros(2))
