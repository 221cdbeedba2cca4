"""How fast a local job gets going again after its master is SIGKILLed, and what the master's
journal costs on task dispatch.

    python benchmarks/runtime/master_restart.py [--kills 10] [--repeats 3]

1. **Restart.** One training job (the README model and flags, 1 PS + 2 workers, 4 Fashion-MNIST
   files, many epochs) is submitted through the `elasticdl` client, so its master runs under
   the job's owner, which starts it again when it dies. Every few seconds the benchmark
   SIGKILLs the master and measures, per kill: **listening** (from the kill until the new
   master accepts connections on the same port: process start, TensorFlow import, model
   load, journal replay) and **first task dispatched** (until the new master's journal
   records a task handed out, the workers having reconnected and the replicas adopted).
2. **Dispatch rate with and without the journal**, in the same run, interleaved:
   `dispatch_rate.measure` (64 clients on the real master server) once with the task
   manager journaling into a file, once without: tasks/s, and tasks per CPU second of the
   master (what the journal costs the master, whatever else loads the machine). Also the
   task manager alone in this process (get + report, no gRPC), with and without a journal.

Ends with one JSON line of medians.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import dispatch_rate


def _wait(predicate, timeout: float, what: str, poll: float = 0.005):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")


def _status(job_dir: Path) -> dict:
    try:
        return json.loads((job_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _dispatched_after(journal: Path, segment: int) -> bool:
    """A task handed out (alone: "g", or in a lease: "l") in a tasks segment newer than
    ``segment``."""
    from elasticdl.master.journal import decode_frames

    for path in journal.glob("tasks-*.log"):
        if int(path.stem.split("-")[1]) > segment:
            if any(
                op.get("o") in ("g", "l") or "g" in op for op in decode_frames(path.read_bytes())
            ):
                return True
    return False


def _last_segment(journal: Path) -> int:
    return max((int(p.stem.split("-")[1]) for p in journal.glob("tasks-*")), default=0)


def measure_restarts(args) -> dict:
    data = common.prepare_fashion_mnist(args.data)
    work = Path(tempfile.mkdtemp(prefix="elasticdl-master-restart-"))
    train = common.subset_dir(os.path.join(data, "train"), args.files, str(work / "train"))
    env = common.python_env()
    env.pop("ELASTICDL_MASTER_PEX", None)  # the master runs with this interpreter
    env["ELASTICDL_HOME"] = str(work / "home")
    env["ELASTICDL_MASTER_RESTARTS"] = str(args.kills + 1)
    job = "bench-master-restart"

    def cli(*a):
        return subprocess.run(
            [sys.executable, "-m", "elasticdl.client", *a],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=300,
        )

    submitted = cli(
        "train",
        f"--job_name={job}",
        "--platform=local",
        f"--model_zoo={common.MODEL_ZOO}",
        "--model_def=mnist.mnist_functional_api.custom_model",
        f"--training_data={train}",
        "--num_epochs=1000",  # stopped by the benchmark once it has its kills
        "--minibatch_size=64",
        "--num_minibatches_per_task=2",
        "--num_workers=2",
        "--num_ps_pods=1",
        "--detach",
    )
    if submitted.returncode:
        raise RuntimeError(submitted.stderr[-2000:])
    job_dir = work / "home" / "jobs" / job
    journal = job_dir / "journal"
    rng = random.Random(args.seed)
    rows, listen, first = [], [], []
    try:
        _wait(lambda: _status(job_dir).get("records_trained", 0) > 0, 300, "training", 0.2)
        for k in range(args.kills):
            time.sleep(1.0 + 2.0 * rng.random())  # somewhere in training
            status = _status(job_dir)
            pid, port = status["master"]["pid"], status["master"]["port"]
            segment = _last_segment(journal)
            t0 = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            _wait(lambda: not _listening(port), 10, "the old master's port closed", 0.001)
            _wait(lambda: _listening(port), 120, "the new master listening", 0.002)
            t_listen = time.monotonic() - t0
            _wait(lambda: _dispatched_after(journal, segment), 120, "a task dispatched")
            t_first = time.monotonic() - t0
            listen.append(t_listen)
            first.append(t_first)
            records = _status(job_dir).get("records_trained", 0)
            rows.append([k + 1, records, t_listen, t_first])
            # The next kill only once this master's status is written (it knows its replicas).
            _wait(
                lambda: _status(job_dir).get("master", {}).get("restarts") == k + 1,
                60,
                "the new master's status",
                0.05,
            )
    finally:
        cli("cancel", job)
    final = _status(job_dir)
    common.print_table(
        f"Master restart: SIGKILL -> listening again -> first task dispatched ({args.kills} "
        "kills, 1 PS + 2 workers adopted each time)",
        ["kill", "records trained before", "listening (s)", "first task dispatched (s)"],
        rows,
    )
    ps = [r for r in final.get("replicas", []) if r.get("name") == "ps-0"]
    return {
        "kills": args.kills,
        "listening_s": round(common.median(listen), 3),
        "first_task_s": round(common.median(first), 3),
        "first_task_min_s": round(min(first), 3),
        "first_task_max_s": round(max(first), 3),
        "ps_relaunches": ps[-1]["restarts"] if ps else None,
        "workers_relaunched": sum(1 for r in final.get("replicas", []) if r.get("replaced_by")),
    }


def measure_journal_cost(args) -> dict:
    os.environ["PYTHONPATH"] = common.python_env()["PYTHONPATH"]  # for the spawned processes
    rates = {"without journal": [], "with journal": []}
    per_cpu = {"without journal": [], "with journal": []}
    rows = []
    for r in range(args.repeats):
        for name in rates:  # interleaved, so both see the same machine load
            with tempfile.TemporaryDirectory(prefix="elasticdl-journal-") as tmp:
                res = dispatch_rate.measure(
                    args.clients,
                    args.processes,
                    args.seconds,
                    journal_dir=tmp if name == "with journal" else "",
                )
                size = sum(p.stat().st_size for p in Path(tmp).iterdir())
            if res["accounted"] != res["tasks"]:
                raise RuntimeError(f"{name}: accounted {res['accounted']} of {res['tasks']}")
            rates[name].append(res["tasks_per_s"])
            per_cpu[name].append(res["tasks_per_master_cpu_s"])
            rows.append(
                [
                    r + 1,
                    name,
                    res["tasks"],
                    res["tasks_per_s"],
                    res["tasks_per_master_cpu_s"],
                    size / 1e6,
                ]
            )
    common.print_table(
        f"Dispatch rate with and without the journal ({args.clients} clients, "
        f"{args.seconds:.0f} s per run)",
        ["run", "master", "tasks", "tasks/s", "tasks per master CPU s", "journal MB"],
        rows,
    )
    without = common.median(rates["without journal"])
    with_ = common.median(rates["with journal"])
    cpu_without = common.median(per_cpu["without journal"])
    cpu_with = common.median(per_cpu["with journal"])
    return {
        "tasks_per_s_without_journal": round(without, 1),
        "tasks_per_s_with_journal": round(with_, 1),
        "journal_ratio": round(with_ / without, 3),
        "tasks_per_master_cpu_s_without_journal": round(cpu_without, 1),
        "tasks_per_master_cpu_s_with_journal": round(cpu_with, 1),
        "journal_cpu_ratio": round(cpu_with / cpu_without, 3),
    }


def measure_task_manager(args) -> dict:
    """get + report of ``n`` tasks on the task manager alone, with and without a journal."""
    from elasticdl.master.journal import Journal
    from elasticdl.master.task_manager import TaskManager, TaskManagerConfig

    n = args.tm_tasks

    def run(journal_dir: str) -> float:
        tm = TaskManager(
            TaskManagerConfig(records_per_task=1, minibatch_size=1),
            training_shards=[("bench", 0, n)],
        )
        if journal_dir:
            journal = Journal(journal_dir, "tasks")
            journal.open()
            tm.attach_journal(journal)
        t0 = time.perf_counter()
        task = tm.get(0)
        while task.task_id:
            task = tm.report_and_get(task.task_id, True, 0, {"records": 1}, "", 7)
        elapsed = time.perf_counter() - t0
        if journal_dir:
            journal.close()
        return n / elapsed

    rates = {"without journal": [], "with journal": []}
    for _ in range(args.repeats):
        for name in rates:
            with tempfile.TemporaryDirectory(prefix="elasticdl-journal-") as tmp:
                rates[name].append(run(tmp if name == "with journal" else ""))
    common.print_table(
        f"Task manager alone: get + report of {n} tasks in one thread",
        ["master", "tasks/s (each run)", "median"],
        [[k, " ".join(f"{x:,.0f}" for x in v), common.median(v)] for k, v in rates.items()],
    )
    without = common.median(rates["without journal"])
    with_ = common.median(rates["with journal"])
    return {
        "tm_tasks_per_s_without_journal": round(without),
        "tm_tasks_per_s_with_journal": round(with_),
        "tm_journal_ratio": round(with_ / without, 3),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--files", type=int, default=4, help="Fashion-MNIST training files")
    p.add_argument("--data", default=common.DEFAULT_CACHE)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3, help="dispatch-rate pairs")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--tm_tasks", type=int, default=100_000)
    p.add_argument("--skip", choices=["restart", "dispatch"], default=None)
    args = p.parse_args(argv)
    # A SIGTERM still cancels the benchmark's job (the `finally` of measure_restarts).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    result = {"benchmark": "master_restart", "cpus": os.cpu_count()}
    if args.skip != "dispatch":
        result.update(measure_task_manager(args))
        result.update(measure_journal_cost(args))
    if args.skip != "restart":
        result.update(measure_restarts(args))
    common.print_json(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
