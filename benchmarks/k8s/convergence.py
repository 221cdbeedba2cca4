"""Convergence under churn (the original's Exp. 3): the co-location job (``colocation.py``) run
with a fixed set of workers (the service never scaled up) and under Exp. 2's schedule (workers
preempted and regained), in interleaved pairs, ``--repeats`` of each. Each job evaluates its
final model on the test split; the figure is the gap between the two modes' median accuracy,
in points.

The job has no seed: its initial weights and its task order differ from run to run, so the
repeats show the spread a single job has anyway, against which the gap is read.
"""

from __future__ import annotations

import statistics

import colocation


def run(args, env, core, namespace: str, image: str, data) -> dict:
    runs = []
    for r in range(args.repeats):
        for mode, schedule in (("fixed", ()), ("colocation", args.schedule)):
            png = f"{colocation.TOOL}_convergence_{mode}_{r}.png"
            runs.append(colocation.run(args, env, core, namespace, image, data, schedule, png))
    accuracy = {
        mode: [x["accuracy"] for x in runs if x["mode"] == mode] for mode in ("fixed", "colocation")
    }
    medians = {
        mode: statistics.median(v) if None not in v else None for mode, v in accuracy.items()
    }
    gap = None
    if None not in medians.values():
        gap = round(100 * (medians["colocation"] - medians["fixed"]), 2)
    return {
        "runs": runs,
        "accuracy": accuracy,
        "median_accuracy": medians,
        "gap_points": gap,
    }
