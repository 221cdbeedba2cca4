"""Per-call cost of elasticdl.ops on tiny arrays: the Python between a caller and the kernel.

    python benchmarks/ops/bench_call_overhead.py [--calls 20000] [--repeats 5]

The kernels themselves take well under a microsecond at these sizes (64 floats, 8 ids), so
the times are dispatch, argument checks and the native call. Besides the public functions it
times the parameter server's own update calls (`elasticdl.ps.optimizer.Optimizer.apply_dense`
/ `apply_sparse`, one tiny parameter / 8 ids of a 1000-row table), which is how gradients
reach the kernels in a PS. Each case is `--calls` calls in a row, repeated `--repeats` times
in alternation with the other cases; the median and the minimum per call in microseconds are
reported (on a shared machine the minimum is the steadier figure: other processes only ever
add time). Prints a table, then one JSON summary as the LAST line. Use the same backend on both sides of a
comparison (ELASTICDL_OPS_BACKEND=reference forces the NumPy one).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "python")
)

import elasticdl.ops as ops  # noqa: E402


def _cases():
    rng = np.random.default_rng(0)
    p = rng.standard_normal(64, dtype=np.float32)
    g = rng.standard_normal(64, dtype=np.float32)
    s = [np.zeros(64, np.float32) for _ in range(3)]
    table = rng.standard_normal((1000, 16), dtype=np.float32)
    ts = [np.zeros_like(table) for _ in range(2)]
    ids = rng.integers(0, 1000, 8)
    grads = rng.standard_normal((8, 16), dtype=np.float32)
    out = np.empty((8, 16), np.float32)
    cases = {
        "sgd": lambda: ops.sgd(p, g, 0.1),
        "momentum": lambda: ops.momentum(p, g, s[0], 0.1, 0.9),
        "adam": lambda: ops.adam(p, g, s[0], s[1], 1e-3, 0.9, 0.999, 1e-7, 3),
        "adagrad": lambda: ops.adagrad(p, g, s[2], 0.1, 1e-7),
        "sparse_sgd": lambda: ops.sparse_sgd(table, ids, grads, 0.1),
        "sparse_adam": lambda: ops.sparse_adam(
            table, ids, grads, ts[0], ts[1], 1e-3, 0.9, 0.999, 1e-7, 3
        ),
        "sparse_aggregate": lambda: ops.sparse_aggregate(ids, grads),
        "embedding_lookup_out": lambda: ops.embedding_lookup(table, ids, out=out),
        "dense_accumulate": lambda: ops.dense_accumulate(p, g),
    }
    from elasticdl.ps.embedding_table import EmbeddingTable
    from elasticdl.ps.optimizer import Optimizer, parse_optimizer_config
    from elasticdl.ps.parameters import Parameters

    for opt, opt_args in (("SGD", "learning_rate=0.1"), ("Adam", "learning_rate=0.001")):
        optimizer = Optimizer(parse_optimizer_config(opt, opt_args))
        params = Parameters()
        params.dense["w"] = p.copy()
        dense_grads = {"w": g}
        emb = EmbeddingTable("emb", 16, "zeros")
        emb.rows(np.arange(1000))

        def dense(o=optimizer, ps=params, dg=dense_grads):
            o.apply_dense(ps, dg, 0.01, 3)

        def sparse(o=optimizer, t=emb):
            o.apply_sparse(t, ids, grads, 0.01, 3)

        cases[f"ps_apply_dense_{opt}"] = dense
        cases[f"ps_apply_sparse_{opt}"] = sparse
    return cases


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    cases = _cases()
    times = {name: [] for name in cases}
    for fn in cases.values():  # warm-up
        for _ in range(100):
            fn()
    for _ in range(args.repeats):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            times[name].append((time.perf_counter() - t0) / args.calls * 1e6)
    res = {name: statistics.median(ts) for name, ts in times.items()}
    best = {name: min(ts) for name, ts in times.items()}
    print(f"{'case':24s} {'median':>8s} {'min':>8s}  (us/call)")
    for name, us in res.items():
        print(f"{name:24s} {us:8.2f} {best[name]:8.2f}")
    summary = {
        "backend": ops.backend(),
        "host": platform.node(),
        "loadavg_1m": os.getloadavg()[0],
        "calls": args.calls,
        "repeats": args.repeats,
        "date": time.strftime("%Y-%m-%d"),
        "us_per_call": res,
        "min_us_per_call": best,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
