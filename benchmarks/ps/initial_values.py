"""Initial values of new embedding rows: the NumPy reference against the native fill.

    python benchmarks/ps/initial_values.py [--rows 256,4096,65536] [--dims 8,16] [--repeats 15]

The PS's work when rows appear ("uniform", Keras' default embedding initializer, U(-0.05, 0.05)):
``elasticdl.ops.counter_rng.reference_scaled_uniform`` (NumPy, chunked) and ``scaled_uniform``
(one native call when the extension is loaded) for each number of new rows and dim, on unique
ids in random order. The two are timed in ``--repeats`` interleaved rounds; the figures are
medians, with the load average before and after, the ops backend and the OpenMP team the
native calls got. The outputs are checked to be the same bits first. One JSON line at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

# Run from a checkout without installing anything: benchmarks/ and the sources first.
_HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.dirname(_HERE), os.path.join(_HERE, "..", "..", "src", "python")):
    if os.path.abspath(_path) not in sys.path:
        sys.path.insert(0, os.path.abspath(_path))

import numpy as np  # noqa: E402
from elasticdl.ops import _backend, counter_rng  # noqa: E402
from interleaved import interleaved, load_average  # noqa: E402

LIMIT = 0.05  # "uniform"'s limit, a Python float as the initializers pass it
SEED = 396807507848058987  # the table seed of a table named "user"


class UsageError(Exception):
    pass


def positive_ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise UsageError(f"{flag} must be comma-separated positive integers, got {text!r}")
    return values


def point(rows: int, dim: int, repeats: int) -> dict:
    rng = np.random.default_rng(rows * 131 + dim)
    ids = np.unique(rng.integers(0, 1 << 40, rows + rows // 8))[:rows]
    ids = rng.permutation(ids)
    native = counter_rng.scaled_uniform(SEED, ids, dim, LIMIT)
    reference = counter_rng.reference_scaled_uniform(SEED, ids, dim, LIMIT)
    if not np.array_equal(native.view(np.uint32), reference.view(np.uint32)):
        raise AssertionError(f"native and reference values differ at {rows} rows of dim {dim}")
    seconds = interleaved(
        {
            "reference": lambda: counter_rng.reference_scaled_uniform(SEED, ids, dim, LIMIT),
            "native": lambda: counter_rng.scaled_uniform(SEED, ids, dim, LIMIT),
        },
        repeats,
    )
    ref_ms = statistics.median(seconds["reference"]) * 1e3
    nat_ms = statistics.median(seconds["native"]) * 1e3
    return {
        "rows": rows,
        "dim": dim,
        "reference_ms": round(ref_ms, 4),
        "native_ms": round(nat_ms, 4),
        "speedup": round(ref_ms / nat_ms, 2) if nat_ms > 0 else None,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="256,4096,65536")
    parser.add_argument("--dims", default="8,16")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    try:
        rows = positive_ints(args.rows, "--rows")
        dims = positive_ints(args.dims, "--dims")
        if args.repeats <= 0:
            raise UsageError(f"--repeats must be positive, got {args.repeats}")
    except UsageError as e:
        print(f"initial_values.py: {e}", file=sys.stderr)
        return 2
    before = load_average()
    threads = _backend.native.team_threads() if _backend.native is not None else 1
    points = [point(n, d, args.repeats) for n in rows for d in dims]
    print(f"initial values, {_backend.name()} backend, OpenMP team {threads}: medians of "
          f"{args.repeats} interleaved rounds")  # fmt: skip
    print(f"  {'rows':>7} {'dim':>4} {'reference ms':>13} {'native ms':>10} {'speedup':>8}")
    for p in points:
        print(f"  {p['rows']:>7} {p['dim']:>4} {p['reference_ms']:>13.3f} "
              f"{p['native_ms']:>10.3f} {p['speedup']:>8}")  # fmt: skip
    after = load_average()
    print(f"  load average before {before}, after {after}")
    summary = {
        "benchmark": "ps_initial_values",
        "backend": _backend.name(),
        "team_threads": threads,
        "repeats": args.repeats,
        "points": points,
        "load_average_before": before,
        "load_average_after": after,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
