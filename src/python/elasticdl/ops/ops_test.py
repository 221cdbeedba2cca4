"""Public ``elasticdl.ops`` API (whichever backend is active: native when built) against the
NumPy reference oracle on random data with duplicate ids, plus goldens and error cases.

Where the native module is missing or stale, ``elasticdl.ops`` falls back to the reference and
these tests compare it with itself; under CI (ELASTICDL_REQUIRE_NATIVE_OPS, exported by
scripts/run-tests.sh: Pants builds src/cc:native for them) that fallback is a failure."""

import os
import subprocess
import sys

import elasticdl.ops as ops
import numpy as np
import pytest
from elasticdl.ops import _backend
from elasticdl.ops import reference as R
from elasticdl.ops._checks import BFLOAT16

ROWS, DIM = 257, 19  # odd sizes exercise the vector tails


def _rng(seed=0):
    return np.random.default_rng(seed)


def _ids(rng, n, rows=ROWS, dtype=np.int64):
    # Zipf-ish: many duplicates, plus the boundary rows.
    ids = np.minimum(rng.zipf(1.3, n) - 1, rows - 1)
    ids[: min(n, 2)] = [0, rows - 1][: min(n, 2)]
    return ids.astype(dtype)


def _same(a, b, exact=False):
    if exact:
        np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-6)


def _aggregate_method(ids):
    """Which ranking the native CPU aggregation picks for ``ids``: "range" or "hash"."""
    from elasticdl.ops import _backend

    ids = np.ascontiguousarray(ids, np.int64)
    return _backend.native.cpu_aggregate_method(ids.__array_interface__["data"][0], ids.size)


I64 = np.iinfo(np.int64)


def _run_on_omp_threads(threads, body, timeout, **env):
    """Runs ``body`` (Python source, with np, ops, R and N = elasticdl_native imported) in a
    subprocess with ``threads`` OpenMP threads, checked first: OMP_NUM_THREADS is read once, at
    start-up, so a team size cannot be changed inside this process."""
    code = (
        "import numpy as np, elasticdl.ops as ops\n"
        "from elasticdl.ops import reference as R\n"
        "import elasticdl_native as N\n"
        f"assert N.num_threads() == {threads}\n"
    ) + body
    env = dict(
        os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=os.pathsep.join(sys.path), **env
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=timeout)


def test_backend_reports_a_known_name():
    assert ops.backend() in ("native", "reference")
    assert isinstance(ops.cuda_available(), bool)


def test_the_native_kernels_are_the_backend_loaded():
    from elasticdl.ops import _backend

    if _backend.native is None:
        reason = f"elasticdl.ops runs on the NumPy reference: {_backend._reason}"
        if os.environ.get("ELASTICDL_REQUIRE_NATIVE_OPS"):
            pytest.fail(f"{reason} (ELASTICDL_REQUIRE_NATIVE_OPS is set)", pytrace=False)
        pytest.skip(reason)
    assert ops.backend() == "native"
    assert _backend.native.ABI_VERSION == _backend.NATIVE_ABI


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float16] + ([BFLOAT16] if BFLOAT16 is not None else [])
)
def test_lookup_gather(dtype):
    rng = _rng()
    table = rng.standard_normal((ROWS, DIM)).astype(dtype)
    ids = _ids(rng, 300, dtype=np.int32)
    out = ops.embedding_lookup(table, ids)
    assert out.dtype == table.dtype and out.shape == (300, DIM)
    _same(out.astype(np.float32), table[ids].astype(np.float32), exact=True)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_lookup_pooled(combiner, weighted):
    rng = _rng(1)
    table = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    sizes = rng.integers(0, 9, 40)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    ids = _ids(rng, int(offsets[-1]))
    w = rng.random(ids.size).astype(np.float32) if weighted else None
    got = ops.embedding_lookup(table, ids, offsets, combiner, w)
    assert got.dtype == np.float32 and got.shape == (40, DIM)
    _same(got, R.embedding_lookup(table, ids, offsets, combiner, w))


def test_lookup_pooled_half_table():
    rng = _rng(2)
    table = rng.standard_normal((ROWS, DIM)).astype(np.float16)
    ids, offsets = _ids(rng, 30), np.array([0, 10, 30])
    _same(
        ops.embedding_lookup(table, ids, offsets, "mean"),
        R.embedding_lookup(table, ids, offsets, "mean"),
    )


@pytest.mark.parametrize("n", [0, 1, 5000])
def test_sparse_aggregate(n):
    rng = _rng(3)
    ids = _ids(rng, n) * 1000003 - 7  # wide, also negative, id range
    grads = rng.standard_normal((n, DIM)).astype(np.float32)
    u, g = ops.sparse_aggregate(ids, grads)
    ru, rg = R.sparse_aggregate(ids, grads)
    _same(u, ru, exact=True)
    assert u.dtype == np.int64 and g.dtype == np.float32 and g.shape == (ru.size, DIM)
    _same(g, rg, exact=True)  # duplicates summed in their original order


@pytest.mark.parametrize("shape", [(33, 7), (1031, 1031)])
@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_dense_accumulate(scale, shape):
    rng = _rng(4)
    out = rng.standard_normal(shape).astype(np.float32)
    gs = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    expect = R.dense_accumulate(out.copy(), gs, scale)
    assert ops.dense_accumulate(out, gs, scale) is out
    _same(out, expect)
    ops.dense_accumulate(out, gs[0])
    _same(out, R.dense_accumulate(expect, gs[0]))


def _dense_case(seed, n=1003):
    rng = _rng(seed)
    p = rng.standard_normal(n).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    slots = [np.abs(rng.standard_normal(n)).astype(np.float32) for _ in range(3)]
    return p, g, slots


# 1,200,017 floats: above the size where the native dense kernels split the array across
# threads (chunks aligned to 16 floats, an odd tail), so both paths are compared.
@pytest.mark.parametrize("n", [1003, 1_200_017])
@pytest.mark.parametrize("op", ["sgd", "momentum", "nesterov", "adam", "amsgrad", "adagrad"])
def test_dense_optimizers_match_reference(op, n):
    p, g, s = _dense_case(5, n)
    p2, s2 = p.copy(), [x.copy() for x in s]
    for mod, P, S in ((ops, p, s), (R, p2, s2)):
        if op == "sgd":
            mod.sgd(P, g, 0.1)
        elif op in ("momentum", "nesterov"):
            mod.momentum(P, g, S[0], 0.1, 0.9, nesterov=op == "nesterov")
        elif op in ("adam", "amsgrad"):
            ams = op == "amsgrad"
            mod.adam(
                P,
                g,
                S[0],
                S[1],
                0.01,
                0.9,
                0.999,
                1e-7,
                3,
                amsgrad=ams,
                max_v=S[2] if ams else None,
            )
        else:
            mod.adagrad(P, g, S[0], 0.1, 1e-7)
    # Same float32 operation order in every backend: bit-identical results.
    _same(p, p2, exact=True)
    for a, b in zip(s, s2):
        _same(a, b, exact=True)


@pytest.mark.parametrize("op", ["sgd", "momentum", "nesterov", "adam", "amsgrad", "adagrad"])
def test_sparse_optimizers_match_reference(op):
    rng = _rng(6)
    table = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    slots = [np.abs(rng.standard_normal((ROWS, DIM))).astype(np.float32) for _ in range(3)]
    ids = _ids(rng, 700, dtype=np.int32)
    grads = rng.standard_normal((ids.size, DIM)).astype(np.float32)
    t2, s2 = table.copy(), [x.copy() for x in slots]
    for mod, T, S in ((ops, table, slots), (R, t2, s2)):
        if op == "sgd":
            mod.sparse_sgd(T, ids, grads, 0.1)
        elif op in ("momentum", "nesterov"):
            mod.sparse_momentum(T, ids, grads, S[0], 0.1, 0.9, nesterov=op == "nesterov")
        elif op in ("adam", "amsgrad"):
            ams = op == "amsgrad"
            mod.sparse_adam(
                T,
                ids,
                grads,
                S[0],
                S[1],
                0.01,
                0.9,
                0.999,
                1e-7,
                2,
                amsgrad=ams,
                max_v=S[2] if ams else None,
            )
        else:
            mod.sparse_adagrad(T, ids, grads, S[0], 0.1, 1e-7)
    _same(table, t2, exact=True)
    for a, b in zip(slots, s2):
        _same(a, b, exact=True)


def test_sparse_sgd_golden():
    table = np.zeros((4, 2), np.float32)
    ops.sparse_sgd(table, np.array([1, 3, 3]), np.full((3, 2), -1, np.float32), 0.1)
    np.testing.assert_allclose(table[1], [0.1, 0.1], rtol=1e-6)
    np.testing.assert_allclose(table[3], [0.2, 0.2], rtol=1e-6)


def test_errors():
    table = np.zeros((10, 4), np.float32)
    with pytest.raises(
        ops.IdOutOfRangeError, match=r"ids\[2\] = 10 is out of range for a table of 10 rows"
    ):
        ops.embedding_lookup(table, np.array([0, 9, 10]))
    with pytest.raises(ValueError, match=r"ids\[0\] = -1"):
        ops.sparse_sgd(table, np.array([-1]), np.zeros((1, 4), np.float32), 0.1)
    assert not table.any()  # nothing applied when the ids are bad
    with pytest.raises(TypeError, match="float32"):
        ops.adam(
            table, table.astype(np.float64), table.copy(), table.copy(), 0.1, 0.9, 0.999, 1e-7, 1
        )
    with pytest.raises(ValueError, match="shape"):
        ops.sparse_adagrad(
            table, [1, 2], np.zeros((2, 3), np.float32), np.zeros_like(table), 0.1, 1e-7
        )
    with pytest.raises(ValueError, match="max_v"):
        ops.adam(table, table, table.copy(), table.copy(), 0.1, 0.9, 0.999, 1e-7, 1, amsgrad=True)
    with pytest.raises(ValueError, match="step"):
        ops.adam(table, table, table.copy(), table.copy(), 0.1, 0.9, 0.999, 1e-7, 0)
    ro = np.zeros_like(table)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        ops.sparse_momentum(table, [1], np.zeros((1, 4), np.float32), ro, 0.1, 0.9)
    with pytest.raises(ValueError, match="C-contiguous"):
        ops.dense_accumulate(np.zeros((4, 4), np.float32).T, np.zeros((4, 4), np.float32))
    with pytest.raises(TypeError, match="integer ids"):
        ops.embedding_lookup(table, np.array([0.5]))
    with pytest.raises(ValueError, match="grads"):
        ops.sparse_aggregate([1, 2], np.zeros((3, 4), np.float32))


@pytest.mark.parametrize("dist", ["zipf", "uniform"])
def test_sparse_aggregate_many_partitions_is_exact(dist):
    """Large batches are deduplicated in many hash partitions on several threads; the sums
    must still be bit-identical to a left-to-right sum, and ids sorted."""
    rng = _rng(7)
    n = 60_000
    if dist == "zipf":
        ids = np.minimum(rng.zipf(1.2, n), 10**6) - 1
    else:
        ids = rng.integers(-(2**40), 2**40, n)  # wide signed range: several radix passes
        ids[::3] = ids[0]  # plus one heavy id
    grads = rng.standard_normal((n, 8)).astype(np.float32)
    u, g = ops.sparse_aggregate(ids, grads)
    ru, rg = R.sparse_aggregate(ids, grads)
    _same(u, ru, exact=True)
    _same(g, rg, exact=True)


@pytest.mark.parametrize(
    "case", ["near_max", "negative", "full_range", "outliers", "dense_range", "all_same"]
)
def test_sparse_aggregate_parallel_partitioning_and_sort(case):
    """Batches past the parallel thresholds (>= 16k ids: chunked partitioning; >= 32k unique
    ids: range-bucketed parallel sort of the unique ids) across id layouts that skew the
    buckets; must match the reference exactly."""
    rng = _rng(11)
    n = 90_000
    i64 = np.iinfo(np.int64)
    if case == "near_max":
        ids = i64.max - rng.integers(0, 200_000, n)
    elif case == "negative":
        ids = -rng.integers(1, 10**7, n)
    elif case == "full_range":
        ids = rng.integers(i64.min, i64.max, n, endpoint=True)
        ids[:3] = [i64.min, i64.max, 0]
    elif case == "outliers":  # almost all in the lowest bucket
        ids = rng.integers(0, 10**6, n)
        ids[7], ids[9] = i64.min, i64.max
    elif case == "dense_range":
        ids = rng.permutation(np.arange(n)) + 12345
        ids[::5] = ids[1::5]  # duplicates too
    else:
        ids = np.full(n, -42)
    ids = ids.astype(np.int64)
    grads = rng.standard_normal((n, 4)).astype(np.float32)
    u, g = ops.sparse_aggregate(ids, grads)
    ru, rg = R.sparse_aggregate(ids, grads)
    _same(u, ru, exact=True)
    _same(g, rg, exact=True)


@pytest.mark.parametrize(
    "case,method",
    [
        ("table_rows_uniform", "range"),  # mostly singletons: copied in one sequential pass
        ("table_rows_zipf", "range"),  # mostly repeats: every id grouped
        ("small_batch", "range"),  # below the threads' threshold: one thread
        ("near_int64_max", "range"),
        ("near_int64_min", "range"),
        ("all_same", "range"),
        ("wide_signed", "hash"),
        ("one_outlier", "hash"),
    ],
)
@pytest.mark.parametrize("dim", [64, 19])  # whole cache lines (streaming stores) and a tail
def test_sparse_aggregate_bitmap_ranks_and_hash_agree_with_reference(case, method, dim):
    """Ids in a narrow range (rows of a table) are ranked with bitmaps, wide ones hashed; both
    give the sorted unique ids and sums bit-identical to a left-to-right sum."""
    rng = _rng(13)
    n = 3000 if case == "small_batch" else 70_000
    if case == "table_rows_uniform" or case == "small_batch":
        ids = rng.integers(0, 10 * n, n)
    elif case == "table_rows_zipf":
        ids = np.minimum(rng.zipf(1.2, n), 10**6) - 1
    elif case == "near_int64_max":
        ids = I64.max - rng.integers(0, 5 * n, n)
        ids[0] = I64.max
    elif case == "near_int64_min":
        ids = I64.min + rng.integers(0, 5 * n, n)
        ids[-1] = I64.min
    elif case == "all_same":
        ids = np.full(n, -7)
    elif case == "wide_signed":
        ids = rng.integers(-(2**40), 2**40, n)
        ids[::4] = ids[1]
    else:
        ids = rng.integers(0, n, n)
        ids[n // 2] = 10**15
    ids = ids.astype(np.int64)
    grads = rng.standard_normal((n, dim)).astype(np.float32)
    if ops.backend() == "native":
        assert _aggregate_method(ids) == method
    u, g = ops.sparse_aggregate(ids, grads)
    ru, rg = R.sparse_aggregate(ids, grads)
    _same(u, ru, exact=True)
    _same(g, rg, exact=True)


def test_sparse_aggregate_bitmap_range_threshold():
    """The bitmaps are used while they cost a few words per id: a range 8x the batch is
    ranked by bitmaps, one 2^20x the batch (an empty ~2 GB bitmap) is hashed instead."""
    if ops.backend() != "native":
        pytest.skip("native backend only")
    rng = _rng(14)
    n = 40_000
    narrow = rng.integers(0, 8 * n, n)
    wide = rng.integers(0, n << 20, n)
    assert _aggregate_method(narrow) == "range"
    assert _aggregate_method(wide) == "hash"
    assert _aggregate_method(np.array([I64.min, I64.max])) == "hash"  # span overflows int64
    assert _aggregate_method(np.zeros(0, np.int64)) == "hash"  # nothing to rank


def test_sparse_kernels_are_exact_on_seven_threads():
    """A many-core host in miniature: 7 OpenMP threads (OMP_DYNAMIC set, so the team is not
    trimmed to the free CPUs) over every layout -- uneven position shares, counters capped per
    position ("twice": n/2 groups), hashed ids -- in batches below and above the size that
    hashed ids are shared out from; OMP_NUM_THREADS is read at start-up, hence a subprocess."""
    if ops.backend() != "native":
        pytest.skip("native backend only")
    body = (
        "rng = np.random.default_rng(17)\n"
        "layouts = []\n"
        "for n in (5_003, 70_003):\n"
        "    rows = 8 * n\n"
        "    layouts += [rng.integers(0, rows, n), np.minimum(rng.zipf(1.2, n), rows) - 1,\n"
        "                rng.permutation(np.repeat(np.arange(n // 2), 2)), rng.integers(0, 2**50, n)]\n"
        "for ids in layouts:\n"
        "    rows = 8 * ids.size\n"
        "    g = rng.standard_normal((ids.size, 16)).astype(np.float32)\n"
        "    u, s = ops.sparse_aggregate(ids, g)\n"
        "    ru, rs = R.sparse_aggregate(ids, g)\n"
        "    assert np.array_equal(u, ru) and np.array_equal(s, rs)\n"
        "    if ids.max() < rows:\n"
        "        t = rng.standard_normal((rows, 16)).astype(np.float32)\n"
        "        m, v, t2, m2, v2 = np.zeros_like(t), np.zeros_like(t), t.copy(), np.zeros_like(t), np.zeros_like(t)\n"
        "        ops.sparse_adam(t, ids, g, m, v, 0.01, 0.9, 0.999, 1e-7, 3)\n"
        "        R.sparse_adam(t2, ids, g, m2, v2, 0.01, 0.9, 0.999, 1e-7, 3)\n"
        "        assert np.array_equal(t, t2) and np.array_equal(m, m2) and np.array_equal(v, v2)\n"
    )
    _run_on_omp_threads(7, body, timeout=300, OMP_DYNAMIC="false")


def test_sparse_aggregate_concurrent_calls_are_exact():
    """Calls from several Python threads at once (a PS serving pushes) each get their own
    scratch from the pools, bitmap-ranked and hashed batches alike."""
    from concurrent.futures import ThreadPoolExecutor

    rng = _rng(15)
    cases = []
    for k in range(6):
        n = 20_000 + 7_000 * k
        ids = [
            rng.integers(0, 10**6, n),
            np.minimum(rng.zipf(1.2, n), 10**6) - 1,
            rng.integers(-(2**45), 2**45, n),
        ][k % 3]
        grads = rng.standard_normal((n, 16)).astype(np.float32)
        cases.append((ids, grads, R.sparse_aggregate(ids, grads)))

    def check(case):
        ids, grads, (ru, rg) = case
        for _ in range(5):
            u, g = ops.sparse_aggregate(ids, grads)
            if not (np.array_equal(u, ru) and np.array_equal(g, rg)):
                return False
        return True

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(check, cases * 2))


def test_sparse_aggregate_single_thread_is_exact():
    """With one OpenMP thread the native kernel ranks and sums on one thread (the hashed path in
    one sweep over all positions instead of partition by partition); OMP_NUM_THREADS is read at
    start-up, hence a subprocess."""
    if ops.backend() != "native":
        pytest.skip("native backend only")
    body = (
        "rng = np.random.default_rng(12)\n"
        "for ids in (np.minimum(rng.zipf(1.2, 50_000), 10**6) - 1, rng.integers(0, 10**5, 50_000),\n"
        "            rng.integers(0, 2**50, 50_000)):\n"
        "    g = rng.standard_normal((ids.size, 64)).astype(np.float32)\n"
        "    u, s = ops.sparse_aggregate(ids, g)\n"
        "    ru, rs = R.sparse_aggregate(ids, g)\n"
        "    assert np.array_equal(u, ru) and np.array_equal(s, rs)\n"
    )
    _run_on_omp_threads(1, body, timeout=120)


def test_team_threads_reports_the_team_the_kernels_get():
    """What a benchmark records as the threads of its timings: OMP_NUM_THREADS caps it, the
    load average lowers it (never below one), OMP_DYNAMIC set by the user leaves the cap."""
    if ops.backend() != "native":
        pytest.skip("native backend only")
    native = _backend.native
    assert 1 <= native.team_threads() <= native.num_threads()
    _run_on_omp_threads(1, "assert N.team_threads() == 1\n", timeout=60)
    _run_on_omp_threads(3, "assert N.team_threads() == 3\n", timeout=60, OMP_DYNAMIC="false")


def test_sparse_aggregate_results_survive_block_reuse():
    """The native backend reuses the memory of freed results: a result that is still alive
    (or viewed) must never be overwritten by a later call, and reused blocks hold no stale
    rows."""
    rng = _rng(10)
    n = 40_000  # result > 2 MB: the huge-page-sized blocks
    ids_a, ids_b = rng.integers(0, 10**6, n), rng.integers(0, 10**6, n)
    grads = rng.standard_normal((n, 32)).astype(np.float32)
    ua, ga = ops.sparse_aggregate(ids_a, grads)
    view = ga[5:9]
    keep = ga.copy()
    del ga
    for k in range(6):  # alternate sizes so blocks are handed back and taken again
        ids = ids_b if k % 2 else ids_b[: n // 3]
        u, g = ops.sparse_aggregate(ids, grads[: ids.size])
        ru, rg = R.sparse_aggregate(ids, grads[: ids.size])
        _same(u, ru, exact=True)
        _same(g, rg, exact=True)
        del u, g
    _same(view, keep[5:9], exact=True)
    u0, g0 = ops.sparse_aggregate(np.zeros(0, np.int64), np.zeros((0, 32), np.float32))
    assert u0.shape == (0,) and g0.shape == (0, 32)


def test_lookup_results_survive_block_reuse():
    """Lookup results live in pooled memory that is reused once freed: a result still alive
    (or viewed) is never written by later lookups."""
    rng = _rng(16)
    table = rng.standard_normal((5000, 64)).astype(np.float32)
    ids = rng.integers(0, 5000, 20_000)
    first = ops.embedding_lookup(table, ids)
    view = first[100:104]
    keep = first.copy()
    del first
    for k in range(6):
        other = rng.integers(0, 5000, 20_000 if k % 2 else 7_000)
        _same(ops.embedding_lookup(table, other), table[other], exact=True)
    _same(view, keep[100:104], exact=True)
    assert ops.embedding_lookup(table, np.zeros(0, np.int64)).shape == (0, 64)


@pytest.mark.parametrize(
    "layout,method",
    [
        ("mixed", "range"),  # most positions repeat: every id grouped
        ("mostly_once", "range"),  # rows of ids seen once applied in the sequential pass
        ("spread", "hash"),  # a few ids spread over a large table
    ],
)
@pytest.mark.parametrize("op", ["sgd", "adam", "adagrad"])
def test_sparse_optimizers_large_batch_exact(op, layout, method):
    rng = _rng(8)
    if layout == "mixed":
        rows, dim, n = 5000, 16, 40_000
        ids = np.minimum(rng.zipf(1.1, n) - 1, rows - 1)
        ids[: n // 2] = rng.integers(0, rows, n // 2)  # singletons and heavy repeats mixed
    elif layout == "mostly_once":
        rows, dim, n = 400_000, 8, 30_000
        ids = rng.integers(0, rows, n)
    else:
        rows, dim, n = 400_000, 4, 300
        ids = rng.integers(0, rows, n)
        ids[::7] = ids[3]
    ids = ids.astype(np.int64)
    if ops.backend() == "native":
        assert _aggregate_method(ids) == method  # sparse updates rank ids the same way
    table = rng.standard_normal((rows, dim)).astype(np.float32)
    slots = [np.abs(rng.standard_normal((rows, dim))).astype(np.float32) for _ in range(2)]
    grads = rng.standard_normal((n, dim)).astype(np.float32)
    t2, s2 = table.copy(), [x.copy() for x in slots]
    for mod, T, S in ((ops, table, slots), (R, t2, s2)):
        if op == "sgd":
            mod.sparse_sgd(T, ids, grads, 0.1)
        elif op == "adam":
            mod.sparse_adam(T, ids, grads, S[0], S[1], 0.01, 0.9, 0.999, 1e-7, 4)
        else:
            mod.sparse_adagrad(T, ids, grads, S[0], 0.1, 1e-7)
    _same(table, t2, exact=True)
    for a, b in zip(slots, s2):
        _same(a, b, exact=True)


@pytest.mark.parametrize(
    "layout",
    [
        "small",  # one thread (below the parallel threshold)
        "shuffled",  # unique rows in random order, as a PS's rows for sorted ids usually are
        "spread",  # a few unique rows over a large table
    ],
)
@pytest.mark.parametrize("op", ["sgd", "momentum", "nesterov", "adam", "amsgrad", "adagrad"])
def test_sparse_update_unique_ids_matches_reference(op, layout):
    """`unique_ids=True` (no ranking) against the reference's summing path on the same ids:
    a row's update is its one gradient row either way, so the bits agree."""
    rng = _rng(9)
    rows, dim, n = {"small": (ROWS, DIM, 40), "shuffled": (60_000, 16, 50_000)}.get(
        layout, (400_000, 4, 300)
    )
    ids = rng.permutation(rows)[:n].astype(np.int64)
    spec = {
        "sgd": ops.OptimizerSpec(ops.OptKind.SGD),
        "momentum": ops.OptimizerSpec(ops.OptKind.MOMENTUM, momentum=0.9),
        "nesterov": ops.OptimizerSpec(ops.OptKind.MOMENTUM, momentum=0.8, nesterov=True),
        "adam": ops.OptimizerSpec(ops.OptKind.ADAM),
        "amsgrad": ops.OptimizerSpec(ops.OptKind.ADAM, amsgrad=True),
        "adagrad": ops.OptimizerSpec(ops.OptKind.ADAGRAD),
    }[op]
    k = len(spec.slot_names)
    table = rng.standard_normal((rows, dim)).astype(np.float32)
    slots = [np.abs(rng.standard_normal((rows, dim))).astype(np.float32) for _ in range(k)]
    grads = rng.standard_normal((n, dim)).astype(np.float32)
    t2, s2 = table.copy(), [x.copy() for x in slots]
    ops.sparse_update(spec, table, ids, grads, slots, 0.05, 3, unique_ids=True)
    R.sparse_update(spec, t2, ids, grads, s2, 0.05, 3)
    _same(table, t2, exact=True)
    for a, b in zip(slots, s2):
        _same(a, b, exact=True)


def test_sparse_update_unique_ids_refuses_bad_ids_before_any_update():
    table = np.zeros((10, 4), np.float32)
    grads = np.ones((3, 4), np.float32)
    spec = ops.OptimizerSpec(ops.OptKind.SGD)
    for bad in ([0, 9, 10], [3, -1, 4]):
        with pytest.raises(
            ops.IdOutOfRangeError, match=rf"ids\[\d\] = {bad[1] if bad[1] < 0 else 10}"
        ):
            ops.sparse_update(spec, table, np.array(bad), grads, (), 0.1, unique_ids=True)
    assert not table.any()
    # The oracle holds callers to the promise that the native kernel trusts.
    with pytest.raises(ops.OpsError, match="unique_ids=True but some id repeats"):
        R.sparse_update(spec, table, np.array([1, 2, 1]), grads, (), 0.1, unique_ids=True)
    assert not table.any()


@pytest.mark.parametrize("pooled", [False, True])
def test_lookup_into_out(pooled):
    rng = _rng(9)
    table = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    ids = _ids(rng, 50_000)  # large enough for the streaming-store path
    offsets = np.arange(0, ids.size + 1, 50) if pooled else None
    shape = (offsets.size - 1 if pooled else ids.size, DIM)
    out = np.full(shape, np.nan, np.float32)
    got = ops.embedding_lookup(table, ids, offsets, "sum" if pooled else None, out=out)
    assert got is out
    _same(out, R.embedding_lookup(table, ids, offsets, "sum" if pooled else None), exact=not pooled)
    ref_out = np.empty(shape, np.float32)
    assert (
        R.embedding_lookup(table, ids, offsets, "sum" if pooled else None, out=ref_out) is ref_out
    )
    _same(ref_out, out, exact=not pooled)


def test_lookup_out_errors():
    table = np.zeros((10, 4), np.float32)
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 4\)"):
        ops.embedding_lookup(table, [1, 2], out=np.empty((3, 4), np.float32))
    with pytest.raises(TypeError, match="out: expected dtype float32"):
        ops.embedding_lookup(table, [1, 2], out=np.empty((2, 4), np.float64))
    with pytest.raises(ValueError, match="C-contiguous"):
        ops.embedding_lookup(table, [1, 2], out=np.empty((4, 2), np.float32).T)
