"""sparse_aggregate of ids that already strictly increase skips the ranking and still gives
the reference's bits (a -0.0 row included: the sum writes +0.0)."""
import numpy as np
import pytest
from elasticdl import ops
from elasticdl.ops import _backend
from elasticdl.ops import reference as ref

RNG = np.random.default_rng(8)


def _same_bits(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes()


@pytest.mark.parametrize("ids", [[], [4], [0, 3, 9, 1 << 40], list(range(0, 4096 * 3, 3))])
def test_increasing_ids_sum_as_the_reference(ids):
    ids = np.array(ids, dtype=np.int64)
    grads = RNG.standard_normal((ids.size, 5)).astype(np.float32)
    if ids.size:
        grads[0, 0] = -0.0
    _same_bits(ops.sparse_aggregate(ids, grads), ref.sparse_aggregate(ids, grads))


@pytest.mark.parametrize("ids", [[3, 1], [2, 2], [0, 5, 5, 7], [1, 2, 3, 0]])
def test_ids_out_of_order_or_repeated_are_still_ranked(ids):
    ids = np.array(ids, dtype=np.int64)
    grads = RNG.standard_normal((ids.size, 3)).astype(np.float32)
    _same_bits(ops.sparse_aggregate(ids, grads), ref.sparse_aggregate(ids, grads))


@pytest.mark.skipif(_backend.native is None, reason="elasticdl_native not loaded")
def test_the_native_pass_answers_only_for_increasing_ids():
    def answer(ids):
        ids = np.array(ids, dtype=np.int64)
        grads = np.ones((ids.size, 2), np.float32)
        return _backend.native.cpu_aggregate_increasing(
            ids.ctypes.data, ids.size, grads.ctypes.data, 2
        )

    assert answer([1, 2, 3]) is not None and answer([]) is not None
    assert answer([1, 1]) is None and answer([2, 1]) is None
