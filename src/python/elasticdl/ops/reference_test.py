"""The NumPy reference against closed forms and the Go kernel goldens (contract §1.11)."""

import math

import numpy as np
import pytest
from elasticdl.ops import reference as R
from elasticdl.ops.errors import IdOutOfRangeError, OpsError, OpsTypeError


def test_sparse_sgd_golden_duplicates_accumulate():
    table = np.zeros((5, 2), np.float32)
    R.sparse_sgd(table, np.array([1, 3, 3]), np.full((3, 2), -1, np.float32), 0.1)
    np.testing.assert_allclose(table[1], [0.1, 0.1], rtol=1e-6)
    np.testing.assert_allclose(table[3], [0.2, 0.2], rtol=1e-6)
    assert not table[[0, 2, 4]].any()


def _adam_closed_form(p, grads, lr, b1, b2, eps, amsgrad):
    p = p.astype(np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    mx = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mx = np.maximum(mx, v)
        lr_t = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        p = p - lr_t * m / (np.sqrt(mx if amsgrad else v) + eps)
    return p


@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_matches_closed_form(amsgrad):
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal(50).astype(np.float32)
    # Shrinking gradients make v fall, so AMSGrad's max_v really differs from v.
    grads = [rng.standard_normal(50).astype(np.float32) * s for s in (3.0, 1.0, 0.1, 0.01)]
    p, m, v, mx = (
        p0.copy(),
        np.zeros(50, np.float32),
        np.zeros(50, np.float32),
        np.zeros(50, np.float32),
    )
    for t, g in enumerate(grads, start=1):
        R.adam(
            p, g, m, v, 0.01, 0.9, 0.999, 1e-7, t, amsgrad=amsgrad, max_v=mx if amsgrad else None
        )
    np.testing.assert_allclose(
        p, _adam_closed_form(p0, grads, 0.01, 0.9, 0.999, 1e-7, amsgrad), rtol=1e-5, atol=1e-6
    )


def test_sparse_adam_equals_dense_adam_on_aggregated_rows():
    rng = np.random.default_rng(1)
    table = rng.standard_normal((6, 3)).astype(np.float32)
    ids = np.array([4, 0, 4, 2])
    grads = rng.standard_normal((4, 3)).astype(np.float32)
    m, v = np.zeros_like(table), np.zeros_like(table)
    expect = table.copy()
    for r in (0, 2, 4):
        g = grads[ids == r].sum(0)
        expect[r] = _adam_closed_form(table[r], [g], 0.1, 0.9, 0.999, 1e-7, False)
    R.sparse_adam(table, ids, grads, m, v, 0.1, 0.9, 0.999, 1e-7, 1)
    np.testing.assert_allclose(table, expect, rtol=1e-5, atol=1e-6)


def test_momentum_and_nesterov_closed_form():
    p, v = np.ones(3, np.float32), np.full(3, 0.5, np.float32)
    g = np.array([1, 2, 3], np.float32)
    R.momentum(p, g, v, 0.1, 0.9)
    np.testing.assert_allclose(v, 0.45 + g, rtol=1e-6)
    np.testing.assert_allclose(p, 1 - 0.1 * (0.45 + g), rtol=1e-6)
    p2, v2 = np.ones(3, np.float32), np.full(3, 0.5, np.float32)
    R.momentum(p2, g, v2, 0.1, 0.9, nesterov=True)
    np.testing.assert_allclose(p2, 1 - 0.1 * (g + 0.9 * (0.45 + g)), rtol=1e-6)


def test_adagrad_closed_form():
    p, acc = np.ones(2, np.float32), np.full(2, 0.1, np.float32)
    g = np.array([1.0, -2.0], np.float32)
    R.adagrad(p, g, acc, 0.5, 1e-7)
    np.testing.assert_allclose(acc, [1.1, 4.1], rtol=1e-6)
    np.testing.assert_allclose(p, 1 - 0.5 * g / (np.sqrt([1.1, 4.1]) + 1e-7), rtol=1e-6)


def test_lookup_combiners_follow_tf_semantics():
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    ids, offs, w = (
        np.array([1, 3, 2]),
        np.array([0, 2, 2, 3]),
        np.array([1.0, 3.0, 2.0], np.float32),
    )
    s = R.embedding_lookup(table, ids, offs, "sum", w)
    np.testing.assert_allclose(s[0], table[1] + 3 * table[3])
    assert not s[1].any()  # empty bag
    np.testing.assert_allclose(
        R.embedding_lookup(table, ids, offs, "mean", w)[0], (table[1] + 3 * table[3]) / 4
    )
    np.testing.assert_allclose(
        R.embedding_lookup(table, ids, offs, "sqrtn", w)[2], 2 * table[2] / 2, rtol=1e-6
    )
    np.testing.assert_array_equal(R.embedding_lookup(table, ids), table[ids])


def test_aggregate_sorted_and_summed():
    u, g = R.sparse_aggregate(
        np.array([5, 1, 5], np.int32), np.array([[1.0], [2.0], [3.0]], np.float32)
    )
    np.testing.assert_array_equal(u, [1, 5])
    np.testing.assert_array_equal(g, [[2.0], [4.0]])


def test_aggregate_chunked_order():
    """The CUDA summation order. In float32 (ulp 8 at 1e8), 1e8 + 1 - 1e8 + 1 left to right is
    ((1e8 + 1) - 1e8) + 1 = 0 + 1 = 1; in chunks of 2 it is (1e8 + 1) + (-1e8 + 1) = 1e8 - 1e8 = 0.
    """
    ids = np.zeros(4, np.int64)
    g = np.array([[1e8], [1.0], [-1e8], [1.0]], np.float32)
    np.testing.assert_array_equal(R.sparse_aggregate(ids, g)[1], [[1.0]])
    np.testing.assert_array_equal(R.sparse_aggregate_chunked(ids, g, 2)[1], [[0.0]])
    np.testing.assert_array_equal(R.sparse_aggregate_chunked(ids, g, 4)[1], [[1.0]])
    rng = np.random.default_rng(5)
    ids = np.minimum(rng.zipf(1.3, 3000), 300)
    g = rng.standard_normal((3000, 5)).astype(np.float32)
    u, counts = np.unique(ids, return_counts=True)
    (u1, a), (u2, b) = R.sparse_aggregate(ids, g), R.sparse_aggregate_chunked(ids, g, 32)
    np.testing.assert_array_equal(u1, u2)
    np.testing.assert_array_equal(a[counts <= 32], b[counts <= 32])
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_errors_are_clear():
    table = np.zeros((3, 2), np.float32)
    with pytest.raises(IdOutOfRangeError, match=r"ids\[1\] = 3 .* table of 3 rows"):
        R.embedding_lookup(table, [0, 3])
    with pytest.raises(OpsTypeError, match="float32"):
        R.sgd(np.zeros(2), np.zeros(2), 0.1)
    with pytest.raises(OpsError, match="read-only"):
        ro = np.zeros(2, np.float32)
        ro.flags.writeable = False
        R.sgd(ro, np.zeros(2, np.float32), 0.1)
    with pytest.raises(OpsError, match="C-contiguous"):
        R.sgd(np.zeros((2, 4), np.float32)[:, ::2], np.zeros((2, 2), np.float32), 0.1)
    with pytest.raises(OpsError, match="offsets"):
        R.embedding_lookup(table, [0, 1], [0, 1], "sum")
    with pytest.raises(OpsError, match="combiner"):
        R.embedding_lookup(table, [0, 1], [0, 2], "max")
