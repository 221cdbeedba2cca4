"""Timing for benchmarks that compare a case with a baseline measured in the same run.

The cases are timed in interleaved rounds (case A, baseline, case A, baseline, ...) so that a
change of load on a shared machine hits all of them alike; each figure is the median of its
rounds, and the ratio of two medians is what the benchmark reports first. The load average
before and after is recorded beside them: a figure taken at load 12 is not one taken at 1.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional


def load_average() -> List[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not on this platform
        return []


def interleaved(
    cases: Dict[str, Callable[[], object]],
    repeats: int,
    before_each: Optional[Callable[[str], object]] = None,
) -> Dict[str, List[float]]:
    """Seconds of each case in each of ``repeats`` rounds; the cases run in turn within a
    round. ``before_each(name)`` runs untimed before each call (fresh state, say)."""
    seconds: Dict[str, List[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, call in cases.items():
            if before_each is not None:
                before_each(name)
            t0 = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - t0)
    return seconds


def summary(
    benchmark: str,
    seconds: Dict[str, List[float]],
    ratio: tuple,
    load_before: List[float],
    **extra,
) -> dict:
    """The JSON summary: medians, the ratio ``ratio[0] / ratio[1]`` of two cases' medians,
    every round's seconds and the load averages."""
    medians = {name: statistics.median(s) for name, s in seconds.items()}
    case, baseline = ratio
    return {
        "benchmark": benchmark,
        "ratio": {
            "case": case,
            "baseline": baseline,
            "value": medians[case] / medians[baseline] if medians[baseline] > 0 else None,
        },
        "median_s": medians,
        "rounds_s": seconds,
        "load_average_before": load_before,
        "load_average_after": load_average(),
        **extra,
    }


def print_summary(result: dict, per: Optional[tuple] = None) -> None:
    """A table of the medians (and ``per = (count, unit)``: the rate per median), the ratio,
    the load averages, then the JSON line."""
    count, unit = per if per else (None, None)
    print(
        f"{result['benchmark']}: medians of {len(next(iter(result['rounds_s'].values())))} rounds"
    )
    width = max(len(n) for n in result["median_s"])
    for name, s in result["median_s"].items():
        rate = f"  {count / s:,.0f} {unit}/s" if count and s > 0 else ""
        print(f"  {name:<{width}}  {s * 1000:10.3f} ms{rate}")
    r = result["ratio"]
    value = "n/a" if r["value"] is None else f"{r['value']:.2f}"
    print(f"  ratio {r['case']} / {r['baseline']}: {value}")
    print(
        f"  load average before {result['load_average_before']}, "
        f"after {result['load_average_after']}"
    )
    print(json.dumps(result))
    sys.stdout.flush()
