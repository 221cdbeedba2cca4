"""CPU per minibatch: the sparse job's trainer and PS against the plain Keras loop, same run.

    python benchmarks/runtime/cpu_per_minibatch.py [--rows 40000] [--minibatches 150]
        [--warmup 30] [--modes sync,async] [--ps 1] [--optimizer sgd] [--repeats 1]
        [--profile DIR]

The model, data and loop are sparse_job.py's (DeepFM on synthetic_ctr, `keras.layers.Embedding`
for the loop, the project's PS `Embedding` for the job). The training minibatches are read
once into memory, so neither side pays its feed here: what is compared is the work of a step.
Per PS count of `--ps` (e.g. `1,2`) and mode, each with fresh PS processes (`python -m
elasticdl.ps.main` on 127.0.0.1, the optimizer the model names), `PSTrainer.train_minibatch`
runs `--warmup` minibatches, then `--minibatches` timed ones (async: until every push was
answered); the loop runs the same minibatches in this process first.

Reported per minibatch, user + system CPU: the worker (this process, all threads, and its main
thread alone), the PS processes (from /proc, summed), their total, and the loop's; ratio = the
loop's CPU / the job's total (>= 1 means the job spends no more CPU than the loop). CPU time moves
far less with the machine's other load than wall time, which is printed too. `--profile DIR`
writes a cProfile of the worker's main thread over the timed minibatches of each mode
(DIR/worker_<mode>.prof) and one of the first PS's answers to the frames of its local channels
(DIR/ps_<mode>.prof: every push and pull of this set-up; the frames' socket reads and writes
are outside it), and prints their top functions; with several PS counts the files are
DIR/<who>_<N>ps_<mode>.prof. JSON keys are `<mode>_...` for 1 PS and `<N>ps_<mode>_...` for
N > 1. Prints a table, then a JSON line.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import secrets
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (puts the sources on the path)
import sparse_job  # noqa: E402

MODES = ("sync", "async")


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_minibatches(args, spec) -> list:
    from elasticdl.common.model_utils import Mode

    train = os.path.join(args.data, "train")
    batches = list(sparse_job.minibatches(spec, train, Mode.TRAINING, args.minibatch_size))
    needed = args.warmup + args.minibatches
    if len(batches) < needed:
        raise SystemExit(
            f"--rows {args.rows} gives {len(batches)} training minibatches, fewer than "
            f"--warmup + --minibatches = {needed}: raise --rows"
        )
    return batches[:needed]


def _timed(run, n: int, pids=(), profile: str = "") -> dict:
    """CPU and wall time of `run()` (which trains `n` minibatches), per minibatch, in ms."""
    profiler = cProfile.Profile() if profile else None
    proc0, main0 = time.process_time(), time.thread_time()
    others0 = [_proc_cpu_s(p) for p in pids]
    wall0 = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    run()
    if profiler is not None:
        profiler.disable()
    wall = time.perf_counter() - wall0
    proc, main = time.process_time() - proc0, time.thread_time() - main0
    others = sum(_proc_cpu_s(p) - c for p, c in zip(pids, others0))
    if profiler is not None:
        profiler.dump_stats(profile)
    per = 1000.0 / n
    return {
        "cpu_ms": proc * per,
        "main_thread_cpu_ms": main * per,
        "server_cpu_ms": others * per,
        "total_cpu_ms": (proc + others) * per,
        "wall_ms": wall * per,
    }


def measure_loop(args, batches) -> dict:
    spec = sparse_job.model_spec(args, embedding="keras")
    _, step = sparse_job.keras_step(spec)
    warm, timed = batches[: args.warmup], batches[args.warmup :]
    for features, labels in warm:
        loss = step(features, labels)
    float(loss)

    def run():
        for features, labels in timed:
            out = step(features, labels)
        float(out)

    return _timed(run, len(timed))


class PSProcess:
    """PS `ps_id` of `num_ps` (`python -m elasticdl.ps.main`) on 127.0.0.1 with the model's
    optimizer and the job's `secret`."""

    def __init__(
        self,
        spec,
        use_async: bool,
        minibatch_size: int,
        secret: str,
        ps_id: int = 0,
        num_ps: int = 1,
        profile: str = "",
    ):
        from elasticdl.common import auth
        from elasticdl.common.model_utils import get_optimizer_info

        opt_type, opt_args = get_optimizer_info(spec.optimizer())
        self.port = common.free_port()
        env = dict(common.python_env(), **{auth.JOB_SECRET_ENV: secret})
        # With `profile`, this script runs the PS (see `serve_profiled`).
        run = ["-m", "elasticdl.ps.main"] if not profile else [__file__, "_ps", profile, "--"]
        argv = [
            sys.executable,
            *run,
            f"--port={self.port}",
            f"--ps_id={ps_id}",
            f"--num_ps_pods={num_ps}",
            "--bind_host=127.0.0.1",
            f"--opt_type={opt_type}",
            f"--opt_args={opt_args}",
            f"--use_async={'true' if use_async else 'false'}",
            f"--minibatch_size={minibatch_size}",
            "--log_level=WARNING",
        ]
        self.proc = subprocess.Popen(argv, env=env)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def serve_profiled(profile: str, ps_argv) -> int:
    """A PS whose local channels' answers are profiled (one frame at a time: the profiler is
    not thread-safe), written to `profile` when the PS stops."""
    import atexit
    import threading

    from elasticdl.ps import local_channel_server, main

    profiler, lock = cProfile.Profile(), threading.Lock()
    answer = local_channel_server.LocalChannelServer._answer

    def profiled(self, *a, **kw):
        with lock:
            profiler.enable()
            try:
                return answer(self, *a, **kw)
            finally:
                profiler.disable()

    local_channel_server.LocalChannelServer._answer = profiled
    atexit.register(profiler.dump_stats, profile)
    return main.main(ps_argv)


def _profile_name(who: str, key: str) -> str:
    return f"{who}_{key}.prof"


def run_key(num_ps: int, mode: str) -> str:
    """`mode` for 1 PS, `<N>ps_<mode>` for more: the JSON keys' and profiles' prefix."""
    return mode if num_ps == 1 else f"{num_ps}ps_{mode}"


def measure_job(args, batches, mode: str, profile: str = "", num_ps: int = 1) -> dict:
    from elasticdl.worker.ps_client import PSClient, wait_for_ps
    from elasticdl.worker.ps_trainer import PSTrainer, TrainerConfig

    spec = sparse_job.model_spec(args)
    use_async = mode == "async"
    key = run_key(num_ps, mode)
    ps_profile = os.path.join(profile, _profile_name("ps", key)) if profile else ""
    secret = secrets.token_hex(16)
    servers = []
    client = None
    try:
        for ps_id in range(num_ps):  # appended one by one: `finally` stops those started
            profiled = ps_profile if ps_id == 0 else ""
            servers.append(
                PSProcess(spec, use_async, args.minibatch_size, secret, ps_id, num_ps, profiled)
            )
        addrs = [f"127.0.0.1:{ps.port}" for ps in servers]
        client = PSClient(addrs, secret=secret)
        wait_for_ps(client, 60)
        trainer = PSTrainer(spec, client, TrainerConfig(overlap_pushes=use_async))
        warm, timed = batches[: args.warmup], batches[args.warmup :]
        for i, (features, labels) in enumerate(warm):
            trainer.train_minibatch(features, labels)
            if i == len(warm) // 2:
                # As at a task's end: the async step after it is traced once more, here and
                # not in the timed minibatches.
                trainer.wait_for_pushes()
        trainer.wait_for_pushes()

        def run():
            for features, labels in timed:
                trainer.train_minibatch(features, labels)
            trainer.wait_for_pushes()  # a task is done only once its pushes were answered

        worker_profile = os.path.join(profile, _profile_name("worker", key)) if profile else ""
        out = _timed(run, len(timed), pids=[ps.proc.pid for ps in servers], profile=worker_profile)
        out["steps"] = trainer.steps
        out["shared_memory_ps"] = client.shared_memory_ps()
        return out
    finally:
        if client is not None:
            client.close()
        for ps in servers:
            ps.close()


def _ms(value: float) -> str:
    return f"{value:.2f}"


def _print_profile(path: str, top: int = 25) -> None:
    buf = io.StringIO()
    pstats.Stats(path, stream=buf).sort_stats("cumulative").print_stats(top)
    print(buf.getvalue())


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["_ps"]:  # python cpu_per_minibatch.py _ps PROFILE -- <the PS's flags>
        return serve_profiled(argv[1], argv[3:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="", help="prepared synthetic_ctr directory (default: cache)")
    p.add_argument("--rows", type=int, default=40_000)
    p.add_argument("--features", type=int, default=26)
    p.add_argument("--vocab", type=int, default=38_462)
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--optimizer", choices=sorted(sparse_job.OPTIMIZERS), default="sgd")
    p.add_argument("--minibatch_size", type=int, default=256)
    p.add_argument("--warmup", type=int, default=30, help="untimed minibatches first")
    p.add_argument("--minibatches", type=int, default=100, help="timed minibatches")
    p.add_argument("--modes", default="sync,async", help="PS modes, of sync,async")
    p.add_argument("--ps", default="1", help="PS counts, comma-separated (e.g. 1,2)")
    p.add_argument("--repeats", type=int, default=1, help="loop + jobs, alternating")
    p.add_argument("--profile", default="", help="write cProfiles of the worker here")
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes) or len(set(modes)) != len(modes):
        p.error(f"--modes must name some of {','.join(MODES)} once each, got {args.modes!r}")
    if args.warmup < 1 or args.minibatches < 1 or args.repeats < 1:
        p.error("--warmup, --minibatches and --repeats must be >= 1")
    try:
        ps_counts = [int(n) for n in args.ps.split(",") if n.strip()]
    except ValueError:
        ps_counts = []
    if not ps_counts or min(ps_counts) < 1 or len(set(ps_counts)) != len(ps_counts):
        p.error(f"--ps must be distinct PS counts >= 1, comma-separated, got {args.ps!r}")
    runs = [(n, m) for n in ps_counts for m in modes]
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)

    args.data = sparse_job.prepare_data(args)
    batches = load_minibatches(args, sparse_job.model_spec(args))
    load_before = os.getloadavg()
    loops, jobs = [], {run_key(n, m): [] for n, m in runs}
    rows = []
    for r in range(args.repeats):
        loop = measure_loop(args, batches)
        loops.append(loop)
        rows.append([r + 1, "keras loop", _ms(loop["cpu_ms"]), "-", _ms(loop["cpu_ms"]), 1.0,
                     _ms(loop["wall_ms"])])  # fmt: skip
        for num_ps, mode in runs:
            job = measure_job(args, batches, mode, args.profile, num_ps)
            jobs[run_key(num_ps, mode)].append(job)
            rows.append([r + 1, f"1 worker + {num_ps} PS, {mode}", _ms(job["cpu_ms"]),
                         _ms(job["server_cpu_ms"]), _ms(job["total_cpu_ms"]),
                         loop["cpu_ms"] / job["total_cpu_ms"], _ms(job["wall_ms"])])  # fmt: skip
    loop_cpu = common.median([x["cpu_ms"] for x in loops])
    summary = {
        "benchmark": "cpu_per_minibatch",
        "rows": args.rows,
        "table_rows": args.features * args.vocab,
        "optimizer": args.optimizer,
        "minibatch_size": args.minibatch_size,
        "minibatches": args.minibatches,
        "repeats": args.repeats,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "loop_cpu_ms": round(loop_cpu, 2),
        "loop_wall_ms": round(common.median([x["wall_ms"] for x in loops]), 2),
    }
    for mode, runs in jobs.items():
        for key in ("cpu_ms", "main_thread_cpu_ms", "server_cpu_ms", "total_cpu_ms", "wall_ms"):
            name = {"cpu_ms": "worker_cpu_ms", "server_cpu_ms": "ps_cpu_ms"}.get(key, key)
            summary[f"{mode}_{name}"] = round(common.median([j[key] for j in runs]), 2)
        summary[f"{mode}_cpu_ratio"] = round(loop_cpu / summary[f"{mode}_total_cpu_ms"], 3)
        summary[f"{mode}_shared_memory"] = bool(runs[-1]["shared_memory_ps"])
        summary[f"{mode}_steps"] = runs[-1]["steps"]
    common.print_table(
        f"CPU ms per minibatch of {args.minibatch_size}: DeepFM {args.optimizer}, "
        f"{args.features} x {args.vocab:,} embedding rows, {args.minibatches} minibatches "
        f"(load average before {load_before[0]:.1f})",
        ["run", "runner", "worker / loop CPU", "PS CPU", "total CPU", "ratio", "wall ms"],
        rows,
    )
    if args.profile:
        for key in jobs:
            for who in ("worker", "ps"):
                print(f"--- {who}, {key}")
                _print_profile(os.path.join(args.profile, _profile_name(who, key)))
    common.print_json(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
