"""A job with one throttled worker, with and without the master's straggler handling.

    python benchmarks/stragglers/bench_stragglers.py [--files 15] [--workers 2]
        [--throttle 0.05] [--warmup_records 4096] [--repeats 3] [--factor 3]

The README job (`mnist.mnist_functional_api.custom_model` on Fashion-MNIST, 1 PS, minibatch 64,
2 minibatches a task) on the first ``--files`` training files (4,096 records each; 15 = all
60,000), ``--workers`` workers as local processes. Once ``--warmup_records`` are trained,
worker 1 is put in a cgroup whose CFS quota gives it ``--throttle`` of one CPU (a real limit,
as a node under a noisy neighbour or a pod's CPU limit; needs root and a cgroup hierarchy
with the cpu controller). The same job runs with ``--straggler_factor=<--factor>`` (the
default handling: the slow worker's share limited near the end, its tasks backed up by idle
workers) and with ``--straggler_factor=0`` (off), in interleaved rounds.

Per job: wall time from submit to the master's final status, the time from the throttle to
the end, records trained against expected (must be equal), and what the master did (tasks
backed up, backups first, tasks withheld). Prints a table and one JSON line whose
``ratio`` is the median wall time with handling over the median without.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "runtime"))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import common  # noqa: E402
from elasticdl_testing.cpu_throttle import ThrottleUnavailable, cpu_throttled  # noqa: E402
from interleaved import load_average  # noqa: E402

MODEL_DEF = "mnist.mnist_functional_api.custom_model"


class UsageError(Exception):
    pass


def worker_pid(status: dict, worker: int) -> int | None:
    for r in status.get("replicas", []):
        if r.get("name") == f"worker-{worker}" and r.get("phase") == "Running":
            return r.get("pid")
    return None


def run_job(args, home: str, name: str, factor: float) -> dict:
    submitted = time.monotonic()
    job_dir = common.submit_local_job(
        home,
        name,
        [
            f"--model_def={MODEL_DEF}",
            f"--training_data={args.train}",
            "--num_epochs=1",
            "--minibatch_size=64",
            "--num_minibatches_per_task=2",
            f"--num_workers={args.workers}",
            "--num_ps_pods=1",
            f"--straggler_factor={factor}",
        ],
    )
    deadline = submitted + args.timeout
    while True:
        status = common.job_status(job_dir)
        pid = worker_pid(status, 1)
        if pid and status.get("records_trained", 0) >= args.warmup_records:
            break
        if status.get("phase") in common.FINAL_PHASES or time.monotonic() > deadline:
            raise RuntimeError(
                f"job {name} ended before worker 1 was throttled ({status.get('phase')}, "
                f"{status.get('records_trained', 0)} records, worker 1 "
                f"{[r.get('phase') for r in status.get('replicas', []) if r.get('name') == 'worker-1']}, "
                f"{status.get('message') or 'no message'}); see {job_dir}"
            )
        time.sleep(0.1)
    with cpu_throttled(pid, args.throttle):
        throttled = time.monotonic()
        while status.get("phase") not in common.FINAL_PHASES:
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {name} did not end in {args.timeout} s; see {job_dir}")
            time.sleep(0.2)
            status = common.job_status(job_dir)
    ended = time.monotonic()
    if status["phase"] != "Succeeded" or status["records_trained"] != status["records_expected"]:
        raise RuntimeError(f"job {name}: {status['phase']}, {status.get('message')}; see {job_dir}")
    s = status.get("stragglers") or {}
    return {
        "wall_s": ended - submitted,
        "after_throttle_s": ended - throttled,
        "records": status["records_trained"],
        "backups_issued": s.get("backups_issued", 0),
        "backups_won": s.get("backups_won", 0),
        "tasks_withheld": s.get("tasks_withheld", 0),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=15)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--throttle", type=float, default=0.05)
    parser.add_argument("--warmup_records", type=int, default=4096)
    parser.add_argument("--factor", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--data", default=common.DEFAULT_CACHE)
    args = parser.parse_args(argv)
    try:
        if args.files < 1 or args.workers < 2 or args.repeats < 1:
            raise UsageError(
                "--files and --repeats must be >= 1, --workers >= 2 (one is throttled)"
            )
        if not 0 < args.throttle <= 1:
            raise UsageError(f"--throttle must be in (0, 1], got {args.throttle}")
    except UsageError as e:
        print(f"bench_stragglers: error: {e}", file=sys.stderr)
        return 2
    load_before = load_average()
    data = common.prepare_fashion_mnist(args.data)
    runs: dict[str, list[dict]] = {"handled": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="bench-stragglers-") as home:
        args.train = common.subset_dir(
            os.path.join(data, "train"), args.files, os.path.join(home, "train")
        )
        try:
            for r in range(args.repeats):
                for mode, factor in (("handled", args.factor), ("off", 0.0)):
                    runs[mode].append(run_job(args, home, f"stragglers-{mode}-{r}", factor))
        except ThrottleUnavailable as e:
            print(f"bench_stragglers: error: {e}", file=sys.stderr)
            return 2
    med = {m: {k: statistics.median(x[k] for x in v) for k in v[0]} for m, v in runs.items()}
    common.print_table(
        f"one worker of {args.workers} at {args.throttle:g} of a CPU after "
        f"{args.warmup_records} records",
        [
            "straggler handling",
            "wall s",
            "after throttle s",
            "backed up",
            "backup first",
            "withheld",
        ],
        [
            [
                m,
                med[m]["wall_s"],
                med[m]["after_throttle_s"],
                med[m]["backups_issued"],
                med[m]["backups_won"],
                med[m]["tasks_withheld"],
            ]
            for m in runs
        ],
    )
    common.print_json(
        {
            "benchmark": "stragglers",
            "files": args.files,
            "workers": args.workers,
            "throttle": args.throttle,
            "repeats": args.repeats,
            "medians": med,
            "runs": runs,
            "ratio": med["handled"]["wall_s"] / med["off"]["wall_s"],
            "load_before": load_before,
            "load_after": load_average(),
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
