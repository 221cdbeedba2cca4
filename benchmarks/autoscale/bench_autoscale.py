"""--num_workers=auto against every fixed number of workers: throughput and throughput per
CPU used, for the README job and the sparse job, on the local platform.

    python benchmarks/autoscale/bench_autoscale.py [--jobs readme,sparse] [--fixed 1,2,...,8]
        [--max_workers 8] [--files 15] [--epochs 2] [--sparse_rows 500000] [--repeats 1]

Jobs (local processes, 1 PS, `elasticdl train` through the client):

* ``readme``: `mnist.mnist_functional_api.custom_model` on the first ``--files`` Fashion-MNIST
  training files (4,096 records each), minibatch 64, 2 minibatches a task, ``--epochs``.
* ``sparse``: `deepfm.deepfm_ctr.custom_model` on synthetic_ctr (benchmarks/runtime/
  sparse_job.py's data, ``--sparse_rows`` rows, 26 features x 38,462 ids), minibatch 256,
  16 minibatches a task, Adam, ``--epochs``.

Each runs with ``--num_workers=N`` for every N of ``--fixed`` and with ``--num_workers=auto
--min_workers=1 --max_workers=<--max_workers>`` (the default rule: a worker is kept when it
pays for its CPU). Per job: records/s from the first record trained to the last (the master's
status, polled), and the CPU the job's processes (master, PS, workers; /proc, sampled) used
over the same span: records per CPU second is throughput per CPU used. The goal: auto's
records per CPU second >= 90% of the best fixed count's; auto's throughput beside the best
fixed count's shows what the sizing costs or saves. Prints a table per job and one JSON line.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "runtime"))
import common  # noqa: E402
import grpc  # noqa: E402
from autoscale_figures import (  # noqa: E402
    GOAL,
    Mark,
    UsageError,
    parse_counts,
    span_figures,
    summarise,
)
from elasticdl.proto import elasticdl_pb2 as pb  # noqa: E402
from interleaved import load_average  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def job_flags(kind: str, args) -> list[str]:
    if kind == "readme":
        return [
            "--model_def=mnist.mnist_functional_api.custom_model",
            f"--training_data={args.readme_data}",
            "--minibatch_size=64",
            "--num_minibatches_per_task=2",
        ]
    return [
        "--model_def=deepfm.deepfm_ctr.custom_model",
        "--model_params=features=26; vocab=38462",
        f"--training_data={os.path.join(args.sparse_data, 'train')}",
        "--minibatch_size=256",
        "--num_minibatches_per_task=16",
    ]


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def job_pids(status: dict) -> list[int]:
    pids = [r.get("pid") for r in status.get("replicas", [])]
    pids.append(status.get("master", {}).get("pid"))
    return [p for p in pids if p]


def run_job(args, kind: str, home: str, name: str, workers: str) -> dict:
    sizing = [f"--num_workers={workers}"]
    if workers == "auto":
        sizing += ["--min_workers=1", f"--max_workers={args.max_workers}"]
    flags = [f"--num_epochs={args.epochs}", "--num_ps_pods=1", *job_flags(kind, args), *sizing]
    job_dir = common.submit_local_job(home, name, flags)
    deadline = time.time() + args.timeout
    channel, stub = common.master_stub(job_dir, deadline)
    cpu: dict[int, float] = {}  # pid -> CPU seconds, the newest sample
    start = end = None
    try:
        while end is None and time.time() < deadline:
            for pid in job_pids(common.job_status(job_dir)):
                cpu[pid] = max(cpu.get(pid, 0.0), cpu_seconds(pid))
            try:
                s = stub.get_job_status(pb.JobStatusRequest(), timeout=5)
            except grpc.RpcError:
                if common.final_phase(job_dir):
                    break
                time.sleep(0.1)
                continue
            now = time.monotonic()
            if start is None and s.records_trained > 0:
                start = Mark(now, s.records_trained, sum(cpu.values()))
            done = s.epoch >= args.epochs and s.records_trained >= s.records_expected > 0
            if start is not None and done:
                end = Mark(now, s.records_trained, sum(cpu.values()))
            if s.phase in common.FINAL_PHASES:
                break
            time.sleep(0.1)
    finally:
        channel.close()
    phase = common.wait_final(job_dir, deadline)
    status = common.job_status(job_dir)
    if phase != "Succeeded" or start is None or end is None:
        raise RuntimeError(
            f"job {name}: {phase or 'unfinished'}, {status.get('message')}; see {job_dir}"
        )
    if status["records_trained"] != status["records_expected"]:
        raise RuntimeError(
            f"job {name} trained {status['records_trained']} records of {status['records_expected']}"
        )
    return span_figures(name, start, end, status.get("autoscaling", {}), workers)


def prepare(args) -> None:
    if "readme" in args.jobs:
        data = common.prepare_fashion_mnist(args.readme_cache)
        args.readme_data = common.subset_dir(
            os.path.join(data, "train"), args.files, os.path.join(args.work, "readme-train")
        )
    if "sparse" in args.jobs:
        import sparse_job

        spec = SimpleNamespace(
            data="", rows=args.sparse_rows, features=26, vocab=38_462, zipf=1.1, seed=0
        )
        args.sparse_data = sparse_job.prepare_data(spec)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="readme,sparse")
    parser.add_argument("--fixed", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--max_workers", type=int, default=8)
    parser.add_argument("--files", type=int, default=15)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--sparse_rows", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--readme_cache", default=common.DEFAULT_CACHE)
    args = parser.parse_args(argv)
    try:
        args.fixed = parse_counts(args.fixed)
        args.jobs = [j for j in args.jobs.split(",") if j]
        if not args.jobs or set(args.jobs) - {"readme", "sparse"}:
            raise UsageError(f"--jobs must name readme and/or sparse, got {','.join(args.jobs)!r}")
        if args.max_workers < 1 or args.files < 1 or args.epochs < 1 or args.repeats < 1:
            raise UsageError("--max_workers, --files, --epochs and --repeats must be >= 1")
    except UsageError as e:
        print(f"bench_autoscale: error: {e}", file=sys.stderr)
        return 2
    load_before = load_average()
    summary = {"benchmark": "autoscale", "goal": GOAL, "jobs": {}}
    with tempfile.TemporaryDirectory(prefix="bench-autoscale-") as work:
        args.work = work
        prepare(args)
        for kind in args.jobs:
            runs: dict[str, list[dict]] = {str(n): [] for n in args.fixed}
            runs["auto"] = []
            for r in range(args.repeats):  # interleaved: load drifts hit every count alike
                for workers in runs:
                    home = os.path.join(work, "home")
                    runs[workers].append(
                        run_job(args, kind, home, f"as-{kind}-{workers}-{r}", workers)
                    )
            summary["jobs"][kind] = summarise(
                f"{kind} job: --num_workers=N vs auto (1..{args.max_workers})", runs, args.fixed
            )
    summary.update(
        fixed=args.fixed,
        max_workers=args.max_workers,
        epochs=args.epochs,
        files=args.files,
        sparse_rows=args.sparse_rows,
        repeats=args.repeats,
        cpus=os.cpu_count(),
        load_before=load_before,
        load_after=load_average(),
    )
    common.print_json(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
