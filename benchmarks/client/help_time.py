"""Start-up time of the light client: `elasticdl.pex --help`, median of N runs.

    ./pants package src/python/client:elasticdl && python3 benchmarks/client/help_time.py

Baseline in the same run: a bare `python3.11 -c pass` (the floor any Python CLI pays). Prints a
table and a JSON line; the target is a median <= 0.25 s with TensorFlow never imported.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_S = 0.25


def median_seconds(argv: list[str], runs: int) -> float:
    subprocess.run(
        argv, stdout=subprocess.DEVNULL, check=True
    )  # warm: the PEX builds its venv once
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    root = Path(__file__).resolve().parents[2]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pex", default=str(root / "dist/src.python.client/elasticdl.pex"))
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    if not Path(args.pex).exists():
        sys.exit(f"no {args.pex}: build it with ./pants package src/python/client:elasticdl")
    # The client must not import TensorFlow (or numpy/grpc) to print its help.
    probe = subprocess.run(
        [
            args.pex,
            "-c",
            "import sys; from elasticdl.client.main import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('tensorflow', 'numpy', 'grpc', 'kubernetes') if m in sys.modules))",
        ],
        env={"PEX_INTERPRETER": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    heavy = probe.stdout.strip().splitlines()[-1] if probe.stdout.strip() else "?"
    help_s = median_seconds([args.pex, "--help"], args.runs)
    python_s = median_seconds(["/usr/bin/env", "python3.11", "-c", "pass"], args.runs)
    print(f"{'command':<28}{'median s':>10}")
    print(f"{'elasticdl.pex --help':<28}{help_s:>10.3f}")
    print(f"{'python3.11 -c pass':<28}{python_s:>10.3f}")
    print(f"heavy modules imported by --help: {heavy}")
    summary = {
        "help_median_s": round(help_s, 4),
        "python_median_s": round(python_s, 4),
        "ratio_to_python": round(help_s / python_s, 2),
        "target_s": TARGET_S,
        "meets_target": help_s <= TARGET_S and heavy == "[]",
        "heavy_modules": heavy,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
