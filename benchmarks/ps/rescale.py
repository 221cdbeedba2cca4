"""How long training pauses when a running job's PS count changes (``elasticdl scale-ps``).

    python benchmarks/ps/rescale.py [--ps 1,2] [--repeats 5] [--files 4] [--tasks_between 20]

One training job (the README model and flags: Fashion-MNIST, 2 workers, local processes)
runs in this process's master. After a warm-up the benchmark measures its two baselines in
the same run, then changes the PS count through the counts of ``--ps`` in turn (1 -> 2 -> 1
-> ...), ``--repeats`` rounds back to the first count, letting ``--tasks_between`` tasks train between two changes:

* **task**: a worker's seconds per task before the first change (the job's time between two
  task reports over ``--tasks_between`` tasks, times its workers);
* **checkpoint save**: the median time for every PS to write its shard (the save_checkpoint
  RPC, all PS at once) while the job trains: the snapshot step of a change on its own;
* **pause** of each change: from dispatch held to dispatch resumed (master.ps_rescale), in
  its parts: drain (the tasks in flight reported), snapshot (every shard written), swap (old
  PS stopped, new PS started, restored and answering).

It prints a table per change and one JSON line of medians, the pause as a multiple of both
baselines, and the load average (the 2-core build VM is noisy; quiet-machine figures go in
benchmarks/ps/README.md).
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "runtime"))
import common  # noqa: E402  (puts the sources on the path)
import in_process_job  # noqa: E402


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")


def _counts(text: str) -> list[int]:
    try:
        counts = [int(c) for c in text.split(",")]
    except ValueError:
        counts = []
    if len(counts) < 2 or min(counts) < 1 or any(a == b for a, b in zip(counts, counts[1:])):
        raise SystemExit(
            f"rescale.py: error: --ps must be PS counts >= 1 like 1,2 (each different from the "
            f"one before), got {text!r}"
        )
    return counts


def run(args) -> dict:
    from elasticdl.master.ps_calls import PSCalls

    counts = _counts(args.ps)
    done: list[float] = []  # when each task was reported done
    job, spec, runner = in_process_job.start_fashion_mnist_job(
        "rescale", args.data, args.files, counts[0], lambda worker_id: done.append(time.monotonic())
    )
    rows = []
    try:
        _wait(lambda: len(done) >= args.warmup, 600, "the warm-up tasks")
        mark = len(done)
        _wait(lambda: len(done) >= mark + args.tasks_between, 600, "the baseline tasks")
        window = done[mark - 1 : mark + args.tasks_between]
        # A worker's time per task: the job's time between two reports times its workers.
        task_s = (window[-1] - window[0]) / (len(window) - 1) * spec.num_workers
        calls = PSCalls(job.secret, job.tls)
        saves = []
        for _ in range(args.saves):
            addrs = job._ps_addrs(job.ps_rescaler.num_ps)
            t0 = time.monotonic()
            threads = [threading.Thread(target=calls.save_shard, args=(a,)) for a in addrs]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            saves.append(time.monotonic() - t0)
        save_s = common.median(saves)
        for i in range(args.repeats * len(counts)):  # each round ends where it began
            target = counts[(i + 1) % len(counts)]
            change = job.ps_rescaler.request(target)
            _wait(lambda: change.state in ("done", "failed"), 600, f"the change to {target} PS")
            if change.state != "done":
                raise RuntimeError(f"the change to {target} PS failed: {change.error}")
            rows.append(change)
            mark = len(done)  # tasks reported from now on were trained on the new PS set
            print(
                f"  {change.from_ps} -> {change.to_ps} PS at version {change.version}: paused "
                f"{change.pause_s:.2f} s (drain {change.drain_s:.2f}, snapshot "
                f"{change.snapshot_s:.2f}, swap {change.swap_s:.2f})",
                flush=True,
            )
            _wait(lambda: len(done) >= mark + args.tasks_between, 600, "tasks after the change")
    finally:
        job.cancel()
        runner.join(120)
    s = job.tm.summary()
    pause = common.median([c.pause_s for c in rows])
    return {
        "benchmark": "ps_rescale",
        "ps_counts": counts,
        "changes": len(rows),
        "pause_s_median": round(pause, 3),
        "pause_s_max": round(max(c.pause_s for c in rows), 3),
        "drain_s_median": round(common.median([c.drain_s for c in rows]), 3),
        "snapshot_s_median": round(common.median([c.snapshot_s for c in rows]), 3),
        "swap_s_median": round(common.median([c.swap_s for c in rows]), 3),
        "task_s": round(task_s, 3),
        "checkpoint_save_s_median": round(save_s, 3),
        "pause_over_task": round(pause / task_s, 1) if task_s else None,
        "pause_over_checkpoint_save": round(pause / save_s, 1) if save_s else None,
        "records_trained": s.records_trained,
        "tasks_failed": s.tasks_failed,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ps", default="1,2", help="PS counts to go through in turn (default 1,2)")
    p.add_argument("--repeats", type=int, default=5, help="rounds through --ps and back")
    p.add_argument("--files", type=int, default=4, help="training shard files (4096 records each)")
    p.add_argument("--warmup", type=int, default=20, help="tasks before measuring")
    p.add_argument("--tasks_between", type=int, default=20, help="tasks between two changes")
    p.add_argument("--saves", type=int, default=5, help="checkpoint saves of the baseline")
    p.add_argument("--data", default=common.DEFAULT_CACHE, help="prepared Fashion-MNIST directory")
    args = p.parse_args(argv)
    for name in ("repeats", "files", "warmup", "tasks_between", "saves"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    result = run(args)
    common.print_json(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
