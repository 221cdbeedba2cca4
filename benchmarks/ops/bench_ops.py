"""Benchmark of elasticdl.ops against same-run baselines on the same data.

    python benchmarks/ops/bench_ops.py [--device cpu|cuda] [--rows 1000000] [--dim 64] [--ids 100000]

Prints a table, then one JSON summary as the LAST line. Times are medians over --repeats
runs after a warm-up; a kernel and its baseline are timed in alternation (ABAB...), so load
from other processes on a shared machine hits both alike. Ratios compare achieved bytes/s
(or time) with a baseline measured in the same process on the same arrays:
  lookup       into a preallocated result (``out=``) vs a plain copy of the same bytes into a
               preallocated array (CPU: np.copyto(dst, src); GPU: device-to-device copy), and
               vs np.take(..., out=) / torch.index_select. Both sides write into existing
               memory, so neither pays first-touch page faults; the allocating call (no
               ``out=``) is reported too, as lookup_alloc_ms. CPU: lookup_threads is the
               OpenMP team the lookups ran on (the kernels follow the load average: one
               thread on a busy host), copy_threads the copy's (np.copyto: one);
  aggregation  vs the best NumPy method (np.unique+np.add.at, argsort+np.add.reduceat,
               bincount per column) / torch.unique+index_add_, timed in alternation with
               them (the headline; its inputs are then cold) and back to back (CPU);
  dense Adam   bytes touched (p, m, v read+write, g read = 28 B/param) vs copy bandwidth.
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
from elasticdl.ops import _backend  # noqa: E402


def median_time(fn, repeats, sync=None):
    fn()
    if sync:
        sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def median_times(fns, repeats, sync=None):
    """Medians of several callables timed in alternation (after one warm-up call each)."""
    for fn in fns:
        fn()
    if sync:
        sync()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            if sync:
                sync()
            times[k].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def make_ids(kind, n, rows, rng):
    if kind == "uniform":
        return rng.integers(0, rows, n, dtype=np.int64)
    return (np.minimum(rng.zipf(1.2, n), rows) - 1).astype(np.int64)  # Zipf(1.2), heavy duplicates


# ----------------------------------------------------------------------------------- CPU
def numpy_aggregate_methods(ids, grads):
    def unique_add_at():
        u, inv = np.unique(ids, return_inverse=True)
        out = np.zeros((u.size, grads.shape[1]), np.float32)
        np.add.at(out, inv, grads)
        return u, out

    def argsort_reduceat():
        order = np.argsort(ids, kind="stable")
        s = ids[order]
        starts = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]]))
        return s[starts], np.add.reduceat(grads[order], starts, axis=0)

    def bincount_cols():
        u, inv = np.unique(ids, return_inverse=True)
        out = np.empty((u.size, grads.shape[1]), np.float32)
        for j in range(grads.shape[1]):
            out[:, j] = np.bincount(inv, weights=grads[:, j], minlength=u.size)
        return u, out

    return {
        "np.unique+np.add.at": unique_add_at,
        "argsort+np.add.reduceat": argsort_reduceat,
        "bincount per column": bincount_cols,
    }


def bench_cpu(args, rng):
    rows, dim, n, rep = args.rows, args.dim, args.ids, args.repeats
    table = rng.standard_normal((rows, dim), dtype=np.float32)
    res = {}
    for dist in ("uniform", "zipf"):
        ids = make_ids(dist, n, rows, rng)
        nbytes = n * dim * 4
        out, out2 = np.empty((n, dim), np.float32), np.empty((n, dim), np.float32)
        src = table[:n].copy()
        teams = {cpu_team()}
        t_copy, t_lookup, t_take, t_alloc = median_times(
            [
                lambda: np.copyto(out2, src),
                lambda: ops.embedding_lookup(table, ids, out=out),
                lambda: np.take(table, ids, axis=0, out=out2),
                lambda: ops.embedding_lookup(table, ids),
            ],
            rep,
        )
        teams.add(cpu_team())
        grads = rng.standard_normal((n, dim), dtype=np.float32)
        methods = numpy_aggregate_methods(ids, grads)
        timed = median_times([lambda: ops.sparse_aggregate(ids, grads), *methods.values()], rep)
        t_agg, base = timed[0], dict(zip(methods, timed[1:]))
        best = min(base, key=base.get)
        # The headline times the kernel alternating with the NumPy methods, which leave its
        # inputs out of the caches; back to back (a PS aggregating pushes as they arrive, its
        # inputs just written) is reported beside it, against the same NumPy figure.
        t_agg_warm = median_time(lambda: ops.sparse_aggregate(ids, grads), rep)
        m, v = np.zeros_like(table), np.zeros_like(table)
        t_sadam = median_time(
            lambda: ops.sparse_adam(table, ids, grads, m, v, 1e-3, 0.9, 0.999, 1e-7, 1), rep
        )
        res[dist] = {
            "unique_ids": int(np.unique(ids).size),
            "lookup_ms": t_lookup * 1e3,
            "copy_ms": t_copy * 1e3,
            "np_take_ms": t_take * 1e3,
            "lookup_alloc_ms": t_alloc * 1e3,
            "lookup_GBps": nbytes / t_lookup / 1e9,
            "copy_GBps": nbytes / t_copy / 1e9,
            "lookup_vs_copy": t_copy / t_lookup,
            "lookup_vs_np_take": t_take / t_lookup,
            # Threads on each side of lookup_vs_copy: np.copyto copies on the calling thread.
            "lookup_threads": sorted(t for t in teams if t is not None),
            "copy_threads": [1],
            "aggregate_ms": t_agg * 1e3,
            "numpy_aggregate_ms": {k: t * 1e3 for k, t in base.items()},
            "numpy_best": best,
            "aggregate_vs_numpy_best": base[best] / t_agg,
            "aggregate_back_to_back_ms": t_agg_warm * 1e3,
            "aggregate_back_to_back_vs_numpy_best": base[best] / t_agg_warm,
            "sparse_adam_ms": t_sadam * 1e3,
        }
    table = None  # free it before the next section
    size = args.dense
    p = rng.standard_normal(size, dtype=np.float32)
    g, m, v = (
        rng.standard_normal(size, dtype=np.float32),
        np.zeros(size, np.float32),
        np.zeros(size, np.float32),
    )
    dst = np.empty_like(p)
    t_copy, t_adam = median_times(
        [lambda: np.copyto(dst, p), lambda: ops.adam(p, g, m, v, 1e-3, 0.9, 0.999, 1e-7, 1)],
        args.repeats,
    )
    copy_bw = 2 * size * 4 / t_copy
    adam_bw = 28 * size / t_adam
    res["dense_adam"] = {
        "params": size,
        "ms": t_adam * 1e3,
        "GBps_touched": adam_bw / 1e9,
        "copy_GBps_rw": copy_bw / 1e9,
        "vs_copy_bandwidth": adam_bw / copy_bw,
    }
    return res


# ---------------------------------------------------------------------------------- CUDA
def bench_cuda(args, rng):
    import torch

    dev = torch.device("cuda")
    sync = torch.cuda.synchronize
    rows, dim, n, rep = args.rows, args.dim, args.ids, args.repeats
    table = torch.randn(rows, dim, device=dev)
    res = {"gpu": torch.cuda.get_device_name()}
    for dist in ("uniform", "zipf"):
        ids = torch.as_tensor(make_ids(dist, n, rows, rng), device=dev)
        nbytes = n * dim * 4
        src, out, out2 = (
            table[:n].clone(),
            torch.empty(n, dim, device=dev),
            torch.empty(n, dim, device=dev),
        )
        t_copy = median_time(lambda: out.copy_(src), rep, sync)
        t_lookup = median_time(lambda: ops.embedding_lookup(table, ids, out=out2), rep, sync)
        t_isel = median_time(lambda: torch.index_select(table, 0, ids), rep, sync)
        grads = torch.randn(n, dim, device=dev)

        def torch_agg():
            u, inv = torch.unique(ids, return_inverse=True)
            return u, torch.zeros(u.numel(), dim, device=dev).index_add_(0, inv, grads)

        t_tagg = median_time(torch_agg, rep, sync)
        t_agg = median_time(lambda: ops.sparse_aggregate(ids, grads), rep, sync)
        m, v = torch.zeros_like(table), torch.zeros_like(table)
        t_sadam = median_time(
            lambda: ops.sparse_adam(table, ids, grads, m, v, 1e-3, 0.9, 0.999, 1e-7, 1), rep, sync
        )
        res[dist] = {
            "lookup_us": t_lookup * 1e6,
            "d2d_copy_us": t_copy * 1e6,
            "index_select_us": t_isel * 1e6,
            "lookup_vs_d2d_copy": t_copy / t_lookup,
            "lookup_vs_index_select": t_isel / t_lookup,
            "lookup_GBps_rw": 2 * nbytes / t_lookup / 1e9,
            "aggregate_us": t_agg * 1e6,
            "torch_unique_index_add_us": t_tagg * 1e6,
            "aggregate_vs_torch": t_tagg / t_agg,
            "sparse_adam_us": t_sadam * 1e6,
        }
    table = None  # free it before the next section
    size = args.dense
    p, g = torch.randn(size, device=dev), torch.randn(size, device=dev)
    m, v, dst = torch.zeros_like(p), torch.zeros_like(p), torch.empty_like(p)
    t_copy = median_time(lambda: dst.copy_(p), rep, sync)
    t_adam = median_time(lambda: ops.adam(p, g, m, v, 1e-3, 0.9, 0.999, 1e-7, 1), rep, sync)
    res["dense_adam"] = {
        "params": size,
        "us": t_adam * 1e6,
        "GBps_touched": 28 * size / t_adam / 1e9,
        "copy_GBps_rw": 8 * size / t_copy / 1e9,
        "vs_copy_bandwidth": (28 * size / t_adam) / (8 * size / t_copy),
    }
    return res


def cpu_team():
    """OpenMP threads the next native CPU kernel gets (None: not the native backend, or a build
    without the query). The kernels size their team by the 1-minute load average
    (`follow_load` in src/cc/kernels_cpu.cc), so a busy host times one thread where an idle
    one times two; sampled before and after the lookups and reported with them."""
    native = _backend.native
    query = getattr(native, "team_threads", None)
    return int(query()) if query is not None else None


def median_of_runs(runs):
    """Element-wise median of the numeric leaves of several result dicts (lists: every value
    any run saw; strings: first run's)."""
    first = runs[0]
    if isinstance(first, dict):
        return {k: median_of_runs([r[k] for r in runs]) for k in first}
    if isinstance(first, list):
        return sorted({v for r in runs for v in r})
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return statistics.median(runs)
    return first


def print_table(res):
    for k, v in res.items():
        if not isinstance(v, dict):
            print(f"{k}: {v}")
            continue
        print(f"[{k}]")
        for name, val in v.items():
            if isinstance(val, dict):
                val = ", ".join(f"{a}={b:.2f}" for a, b in val.items())
            elif isinstance(val, float):
                val = f"{val:.3f}"
            print(f"  {name:28s} {val}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--ids", type=int, default=100_000)
    ap.add_argument(
        "--dense", type=int, default=16_000_000, help="parameters of the dense Adam case"
    )
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--runs",
        type=int,
        default=1,
        help="repeat the whole CPU benchmark this many times; ratios are medians over runs",
    )
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    if args.device == "cuda":
        res = bench_cuda(args, rng)
    else:
        runs = [bench_cpu(args, np.random.default_rng(args.seed)) for _ in range(max(1, args.runs))]
        res = median_of_runs(runs)
    summary = {
        "device": args.device,
        "backend": ops.backend(),
        "host": platform.node(),
        "threads": os.cpu_count(),
        "runs": args.runs,
        "repeats": args.repeats,
        "loadavg_1m": os.getloadavg()[0],
        "rows": args.rows,
        "dim": args.dim,
        "ids": args.ids,
        "date": time.strftime("%Y-%m-%d"),
        **res,
    }
    print_table(res)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
