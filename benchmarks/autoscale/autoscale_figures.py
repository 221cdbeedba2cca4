"""What the `--num_workers=auto` benchmarks share, on whatever platform their jobs run: the
worker counts asked for, one job's figures over its training span, and the per-job summary
(medians, the best fixed counts, auto's ratios to them, the goal) with its table."""
from __future__ import annotations

import os
import statistics
import sys
from typing import NamedTuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "runtime"))
import common  # noqa: E402

GOAL = 0.9  # auto's records per CPU second over the best fixed count's
FIGURES = ("records_per_s", "records_per_cpu_s", "cpus_used")


class UsageError(Exception):
    pass


class Mark(NamedTuple):
    """One end of a job's training span: when (seconds, one clock for both ends), the records
    the job had trained, and the CPU seconds its processes or containers had used."""

    t: float
    records: int
    cpu_s: float


def parse_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(f"--fixed must be comma-separated worker counts like 1,2,4, got {text!r}")
    if min(counts) < 1:
        raise UsageError(f"--fixed counts must be >= 1, got {text!r}")
    return counts


def span_figures(name: str, start: Mark, end: Mark, autoscaling: dict, workers: str) -> dict:
    """The job's figures from its first trained record (``start``) to its last (``end``);
    ``autoscaling`` is the job status's (empty for a fixed count)."""
    if end.t <= start.t or end.records <= start.records:
        raise RuntimeError(f"job {name} trained too few records to be timed: use more data")
    seconds, records, cpu_s = end.t - start.t, end.records - start.records, end.cpu_s - start.cpu_s
    return {
        "records_per_s": records / seconds,
        "records_per_cpu_s": records / max(cpu_s, 1e-9),
        "cpus_used": cpu_s / seconds,
        "seconds": seconds,
        "workers": autoscaling.get("target", workers),
        "decisions": [f"{d['action']}->{d['workers']}" for d in autoscaling.get("decisions", [])],
    }


def summarise(title: str, runs: dict[str, list[dict]], fixed: list[int]) -> dict:
    """Prints the table of ``runs`` (workers -> the figures of each repeat, ``"auto"`` among
    them) under ``title``; returns the job's part of the JSON line."""
    med = {w: {k: statistics.median(x[k] for x in v) for k in FIGURES} for w, v in runs.items()}
    counts = [str(n) for n in fixed]
    best_rate = max(counts, key=lambda w: med[w]["records_per_s"])
    best_eff = max(counts, key=lambda w: med[w]["records_per_cpu_s"])
    common.print_table(
        title,
        ["workers", "records/s", "CPUs used", "records per CPU s", "auto's decisions"],
        [[w, m["records_per_s"], m["cpus_used"], m["records_per_cpu_s"],
          " ".join(runs[w][-1]["decisions"]) or "-"] for w, m in med.items()],
    )  # fmt: skip
    ratio = med["auto"]["records_per_cpu_s"] / med[best_eff]["records_per_cpu_s"]
    return {
        "medians": med,
        "runs": runs,
        "best_fixed_by_throughput": int(best_rate),
        "best_fixed_by_efficiency": int(best_eff),
        "auto_over_best_records_per_cpu_s": ratio,
        "auto_over_best_records_per_s": med["auto"]["records_per_s"]
        / med[best_rate]["records_per_s"],
        "goal_met": ratio >= GOAL,
    }
