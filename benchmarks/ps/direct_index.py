"""The PS's direct id -> row index against the hash map alone, on a sparse job's minibatches.

    python benchmarks/ps/direct_index.py [--vocabulary 200000] [--ids 19968] [--minibatches 40]
        [--cold 10] [--repeats 9]

Two DeepFM-like embedding tables (dim 8 and dim 1) of one PS, built with the vocabulary (the
direct index, ``elasticdl.ps.id_index``) and without it (the hash map alone), each minibatch the
PS's work for a worker's step: ``EmbeddingTable.get`` of the minibatch's unique ids (rows made
on first sight) and the SGD ``apply_sparse`` of their gradients. Ids drawn Zipf(1.05)-like and
uniformly over the vocabulary. Per distribution and phase (the first ``--cold`` minibatches,
which create most rows, and the rest): CPU milliseconds per minibatch of each, in ``--repeats``
interleaved rounds (the order alternating), medians, and the median of the rounds' new/old
ratios with their range. Idle OpenMP threads wait passively, as in a PS (elasticdl.common.
omp_tuning). One JSON line at the end, with the load average before and after and the ops
backend (``ELASTICDL_OPS_BACKEND=reference``: the NumPy hash map).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

# Run from a checkout without installing anything: benchmarks/ and the sources first.
_HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.dirname(_HERE), os.path.join(_HERE, "..", "..", "src", "python")):
    if os.path.abspath(_path) not in sys.path:
        sys.path.insert(0, os.path.abspath(_path))

from elasticdl.common.omp_tuning import passive_omp_wait  # noqa: E402

passive_omp_wait()  # as the PS's main does, before the native kernels load

import numpy as np  # noqa: E402
from elasticdl.ops import _backend  # noqa: E402
from elasticdl.ps.embedding_table import EmbeddingTable  # noqa: E402
from elasticdl.ps.optimizer import Optimizer, OptimizerConfig  # noqa: E402
from interleaved import load_average  # noqa: E402

DIMS = (8, 1)
ZIPF_EXPONENT = 1.05


def minibatches(vocabulary: int, ids: int, count: int, seed: int = 0) -> dict[str, list]:
    """The unique ids of ``count`` minibatches of ``ids`` draws each, per distribution."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(np.arange(1, vocabulary + 1, dtype=np.float64) ** -ZIPF_EXPONENT)
    cdf /= cdf[-1]
    perm = rng.permutation(vocabulary)  # the frequent ids spread over the vocabulary
    return {
        "zipf": [np.unique(perm[np.searchsorted(cdf, rng.random(ids))]) for _ in range(count)],
        "uniform": [np.unique(rng.integers(0, vocabulary, ids)) for _ in range(count)],
    }


def run(batches: list, vocabulary: int, grads: dict, sgd: Optimizer) -> list[float]:
    """CPU ms of each minibatch's pull and apply, from empty tables."""
    tables = [EmbeddingTable(f"t{d}", d, vocabulary=vocabulary) for d in DIMS]
    ms = []
    for step, ids in enumerate(batches, 1):
        t0 = time.process_time()
        for table in tables:
            table.get(ids, checked=True)
            sgd.apply_sparse(table, ids, grads[table.dim][: ids.size], 0.1, step, ids_checked=True)
        ms.append(1e3 * (time.process_time() - t0))
    return ms


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocabulary", type=int, default=200_000)
    p.add_argument("--ids", type=int, default=512 * 39, help="draws a minibatch (before unique)")
    p.add_argument("--minibatches", type=int, default=40)
    p.add_argument("--cold", type=int, default=10)
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args(argv)
    if min(args.vocabulary, args.ids, args.repeats) < 1 or not 0 < args.cold < args.minibatches:
        p.exit(
            2,
            "direct_index: error: --vocabulary, --ids and --repeats must be >= 1 and "
            "0 < --cold < --minibatches\n",
        )
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    load_before = load_average()
    data = minibatches(args.vocabulary, args.ids, args.minibatches)
    rng = np.random.default_rng(1)
    grads = {d: rng.normal(size=(args.ids, d)).astype(np.float32) for d in DIMS}
    sgd = Optimizer(OptimizerConfig("SGD", learning_rate=0.1))
    points = []
    for kind, batches in data.items():
        new_runs, old_runs = [], []
        for rep in range(args.repeats):
            order = ("new", "old") if rep % 2 else ("old", "new")
            for which in order:
                vocab = args.vocabulary if which == "new" else 0
                (new_runs if which == "new" else old_runs).append(run(batches, vocab, grads, sgd))
        for phase, part in (("cold", slice(0, args.cold)), ("warm", slice(args.cold, None))):
            new = [statistics.mean(r[part]) for r in new_runs]
            old = [statistics.mean(r[part]) for r in old_runs]
            ratios = [n / o for n, o in zip(new, old)]
            point = {
                "ids": kind,
                "phase": phase,
                "unique_ids": int(statistics.mean(b.size for b in batches)),
                "old_ms": round(statistics.median(old), 3),
                "new_ms": round(statistics.median(new), 3),
                "ratio": round(statistics.median(ratios), 3),
                "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
            }
            points.append(point)
            print(
                f"{kind:>7} {phase}: hash map {point['old_ms']:.2f} ms, direct index "
                f"{point['new_ms']:.2f} ms per minibatch, new/old {point['ratio']:.2f} "
                f"({point['ratio_range'][0]:.2f}-{point['ratio_range'][1]:.2f})",
                flush=True,
            )
    summary = {
        "benchmark": "ps_direct_index",
        "backend": _backend.name(),
        "vocabulary": args.vocabulary,
        "repeats": args.repeats,
        "points": points,
        "load_before": load_before,
        "load_after": load_average(),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
