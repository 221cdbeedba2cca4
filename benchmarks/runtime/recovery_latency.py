"""How fast a local job recovers from a killed worker: its tasks back in the queue, and a
replacement training.

    python benchmarks/runtime/recovery_latency.py [--kills 10] [--files 4]

One training job (the README model and flags, 1 PS + 2 workers as local processes) runs in
this process's master; every few seconds the benchmark SIGKILLs a worker that holds a task
(like a preempted pod) and measures, per kill:

* **re-queued**: from the kill until the master has taken the worker's tasks back (the
  platform saw the process end and the task manager re-queued what it held);
* **replacement training**: from the kill until the worker that replaced it reported its first
  finished task (process start, TensorFlow import, model build, first task).

It ends with one JSON line of medians. (That nothing is lost or counted twice after such kills
is what tests/python/elasticdl_tests/e2e/recovery_test.py asserts.)
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import common  # noqa: F401  (puts the sources on sys.path)
import in_process_job


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value is not None and value is not False:  # worker id 0 counts
            return value
        time.sleep(0.005)
    raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")


def run(args) -> dict:
    from elasticdl.platform.base import ReplicaType

    done: list[tuple[float, int]] = []  # (time, worker id) of every finished task
    job, _, runner = in_process_job.start_fashion_mnist_job(
        "recovery",
        args.data,
        args.files,
        1,
        lambda worker_id: done.append((time.monotonic(), worker_id)),
    )
    rows = []
    try:
        _wait(lambda: len(done) >= 20, 300, "the job to train its first tasks")
        for kill in range(args.kills):
            victim = _wait(lambda: min(job.tm.doing_workers(), default=None), 60, "a busy worker")
            pid = job.platform.replica_pid(ReplicaType.WORKER, victim)
            t0 = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            _wait(lambda: victim not in job.tm.doing_workers(), 60, "the tasks re-queued")
            requeued = time.monotonic() - t0
            replacement = _wait(
                lambda: next(
                    (
                        r.replaced_by
                        for r in job.rm.replicas()
                        if r.replica_type == ReplicaType.WORKER
                        and r.replica_id == victim
                        and r.replaced_by is not None
                    ),
                    None,
                ),
                60,
                "a replacement",
            )
            first = _wait(
                lambda: next((t for t, w in done if w == replacement and t > t0), None),
                300,
                "the replacement's first task",
            )
            rows.append((kill + 1, victim, replacement, requeued, first - t0))
            print(
                f"  kill {kill + 1:2d}: worker {victim} -> {replacement}: re-queued in "
                f"{requeued * 1000:.0f} ms, replacement trained after {first - t0:.2f} s",
                flush=True,
            )
    finally:
        job.cancel()
        runner.join(120)
    s = job.tm.summary()
    requeue_ms = [r[3] * 1000 for r in rows]
    replace_s = [r[4] for r in rows]
    return {
        "benchmark": "recovery_latency",
        "kills": len(rows),
        "requeue_ms_median": round(common.median(requeue_ms), 1),
        "requeue_ms_max": round(max(requeue_ms), 1),
        "replacement_training_s_median": round(common.median(replace_s), 2),
        "replacement_training_s_max": round(max(replace_s), 2),
        "tasks_recovered": s.tasks_recovered,
        "cpus": os.cpu_count(),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--files", type=int, default=4, help="training shard files (4096 records each)")
    p.add_argument("--data", default=common.DEFAULT_CACHE, help="prepared Fashion-MNIST directory")
    args = p.parse_args(argv)
    if args.kills < 1:
        p.error("--kills must be >= 1")
    result = run(args)
    common.print_json(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
