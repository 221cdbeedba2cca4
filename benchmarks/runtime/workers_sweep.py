"""Workers sweep: the master's dispatch as the number of workers grows (1 .. 10,000).

    python benchmarks/runtime/workers_sweep.py [--workers 1,10,100,300,1000,3000,10000]
        [--seconds 5] [--processes 2] [--workers_per_process 500]
        [--protocol lease|combined|two_calls] [--lease 4]
        [--paced_rate 2200] [--plot out.png]

Each simulated worker is a grpc.aio coroutine with its own channel and its own TCP connection
(as separate worker processes have), authenticated with the job secret, against the real master
server (`create_master_server` + `MasterServicer` + `TaskManager`) in its own process. A worker
loops: get a task, "train" it, report it. Two modes per worker count, each with a fresh master:

* ``saturated``: no training time, every worker asks again as soon as it reported: the
  master's capacity. Latency then grows with the workers by Little's law (N workers in flight
  at R tasks/s wait ~N/R), so the latency target is not about this mode.
* ``paced``: each worker trains each task for ``N / paced_rate`` seconds (1,000 workers at the
  default 2,200 tasks/s: 0.45 s per task), so the workers together offer ``paced_rate`` tasks/s,
  10% above the 2,000 target, like real workers that train between calls. This is the mode
  the targets are about: tasks/s >= 2,000 and p99 <= 100 ms at 1,000 workers.

The protocol is the worker's (``lease``: one `lease_tasks` call per ``--lease`` tasks, with the
results of the tasks run since the last call, as `MasterClient` does), one call per task
(``combined``: `report_task_result_and_get_task`) or the older two calls (``two_calls``:
`get_task`, then `report_task_result`). Two latencies: ``get`` of each call that returns tasks,
and ``wait``, per task, how long its worker had no task in hand (a task from the lease: none;
else the call) -- the figure a user sees. The targets hold for the p99 of both. The master's
RSS is read from /proc when it is idle (its epoch of tasks already created), when every worker
has connected and done one task (the per-worker figure) and at the end (the growth per task
done). Client processes share the
machine's cores with the master; their CPU use is printed so it is clear what bounds a point.

Prints a table and a JSON line; ``--plot`` writes a PNG of the curves.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing as mp
import os
import random
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from elasticdl.worker.master_client import DEFAULT_LEASE_TASKS  # noqa: E402

TARGET_TASKS_PER_S = 2000.0
TARGET_P99_MS = 100.0
PROTOCOLS = ("lease", "combined", "two_calls")
BENCH_SECRET = "workers-sweep-benchmark-secret"
MODES = ("saturated", "paced")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _raise_fd_limit() -> None:
    # A master with 1,000 workers holds 1,000 sockets; the soft limit may be 1,024.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# ---------------------------------------------------------------------------------------- master
def serve_master(out_q, ctl_q, num_tasks: int, profile_path: str) -> None:
    """The master: real task manager, servicer and gRPC server (asyncio, job secret).

    ``profile_path``: profile the server's event-loop thread (where the handlers run) over the
    window with cProfile and write the stats there."""
    import cProfile
    import logging

    from elasticdl.master.server import create_master_server
    from elasticdl.master.servicer import MasterServicer
    from elasticdl.master.task_manager import TaskManager, TaskManagerConfig

    logging.basicConfig(level=logging.WARNING)
    _raise_fd_limit()
    tm = TaskManager(
        TaskManagerConfig(records_per_task=1, num_epochs=1, minibatch_size=1),
        training_shards=[("bench-shard", 0, num_tasks)],
    )
    # The epoch's tasks are created at the first request: make them before the idle RSS, so
    # the per-worker figure holds only what the workers add.
    first = tm.get(-1)
    tm.report(first.task_id, success=True, worker_id=-1)
    servicer = MasterServicer(tm)
    server, port = create_master_server(
        servicer, 0, bind_host="127.0.0.1", use_asyncio=True, secret=BENCH_SECRET
    )
    out_q.put(("port", port, _rss_bytes()))
    _, start_at, seconds = ctl_q.get()
    time.sleep(max(0.0, start_at - time.time()))
    profiler = cProfile.Profile() if profile_path else None
    if profiler is not None:
        server._loop.call_soon_threadsafe(profiler.enable)
    rss_start = _rss_bytes()
    cpu0 = time.process_time()
    time.sleep(seconds)
    cpu = time.process_time() - cpu0
    rss_end = _rss_bytes()
    if profiler is not None:
        server._loop.call_soon_threadsafe(profiler.disable)
        time.sleep(0.2)
        profiler.dump_stats(profile_path)
    ctl_q.get()  # the clients are done
    out_q.put(("master", tm.summary().records_trained - 1, cpu, rss_start, rss_end))
    server.stop(0)


# --------------------------------------------------------------------------------------- clients
def client_process(
    port: int,
    first_id: int,
    n: int,
    protocol: str,
    lease: int,
    train_s: float,
    client_nice: int,
    ready_q,
    go_q,
    result_q,
) -> None:
    """``n`` simulated workers as coroutines of one event loop, one channel each."""
    import grpc
    from elasticdl.common.auth import TOKEN_METADATA_KEY
    from elasticdl.proto import elasticdl_pb2 as pb
    from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc

    _raise_fd_limit()
    if client_nice:
        os.nice(client_nice)
    auth = ((TOKEN_METADATA_KEY, BENCH_SECRET),)
    # A private subchannel pool per channel: one TCP connection per worker, as between pods.
    options = [("grpc.use_local_subchannel_pool", 1)]
    errors: list[str] = []
    latencies: list[float] = []  # of each call that returns tasks
    waits: list[float] = []  # per task: how long its worker had no task in hand
    combined = protocol == "combined"

    def report_of(task, worker_id):
        req = pb.ReportTaskResultRequest(task_id=task.task_id, worker_id=worker_id)
        req.exec_counters["records"] = task.shard.end - task.shard.start
        return req

    async def worker(i: int, ready: list, all_ready: asyncio.Event, go: asyncio.Future):
        worker_id = first_id + i
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            stub = pb_grpc.MasterStub(channel)
            # 10,000 workers connecting at once take minutes on 2 shared cores.
            await asyncio.wait_for(channel.channel_ready(), timeout=600)
            get_req = pb.GetTaskRequest(worker_id=worker_id)
            reported = 0
            # One task before the window: the connection and the master's per-worker state
            # exist when the window starts.
            task = await stub.get_task(get_req, metadata=auth)
            await stub.report_task_result(report_of(task, worker_id), metadata=auth)
            reported += 1
            ready[0] += 1
            if ready[0] == n:
                all_ready.set()
            start_at, ramp, seconds = await go
            begin = start_at + ramp
            end = begin + seconds
            # Paced workers start at random phases of their period (of a lease's tasks for
            # leasing ones), as real ones would be after the job's start; the window begins
            # once every worker has started (``ramp``), so it sees their steady state.
            next_start = start_at + random.random() * ramp
            await asyncio.sleep(max(0.0, next_start - time.time()))
            if protocol == "lease":
                return await leasing_worker(stub, worker_id, begin, end, next_start, reported)
            done = 0
            lat = []
            held = None
            combined_req = pb.ReportAndGetTaskRequest(next=get_req)
            try:
                while time.time() < end:
                    t0 = time.perf_counter()
                    in_window = time.time() >= begin
                    if combined:
                        task = await stub.report_task_result_and_get_task(
                            combined_req, metadata=auth
                        )
                        if held is not None:
                            reported, held = reported + 1, None
                    else:
                        task = await stub.get_task(get_req, metadata=auth)
                    if in_window:
                        lat.append(time.perf_counter() - t0)
                        waits.append(lat[-1])
                    if task.task_id == 0:
                        errors.append("the master ran out of tasks")
                        break
                    held = task
                    if in_window and time.time() < end:  # tasks handed out within the window
                        done += 1
                    if train_s:
                        next_start = max(next_start + train_s, time.time())
                        await asyncio.sleep(max(0.0, next_start - time.time()))
                    if combined:
                        combined_req.result.CopyFrom(report_of(task, worker_id))
                    else:
                        await stub.report_task_result(report_of(task, worker_id), metadata=auth)
                        reported, held = reported + 1, None
                if held is not None:
                    await stub.report_task_result(report_of(held, worker_id), metadata=auth)
                    reported += 1
            except grpc.RpcError as e:
                errors.append(f"{e.code().name}: {e.details()}")
            latencies.extend(lat)
            return done, reported

    async def leasing_worker(
        stub, worker_id: int, begin: float, end: float, next_start: float, reported: int
    ):
        """The real worker's protocol (``MasterClient``): a lease call when the lease is used
        up, with the results of the tasks run since the last one."""
        done = 0
        lat, wait = [], []
        leased: list = []
        results: list = []
        call_id = worker_id << 32
        try:
            while time.time() < end:
                t0 = time.perf_counter()
                in_window = time.time() >= begin
                if not leased:
                    call_id += 1
                    req = pb.LeaseTasksRequest(
                        worker_id=worker_id, max_tasks=lease, call_id=call_id
                    )
                    req.results.extend(results)
                    answer = await stub.lease_tasks(req, metadata=auth)
                    if in_window:
                        lat.append(time.perf_counter() - t0)
                    reported, results = reported + len(results), []
                    leased = list(reversed(answer.tasks))
                    if not leased or leased[-1].task_id == 0:
                        errors.append("the master ran out of tasks")
                        break
                task = leased.pop()
                if in_window:
                    wait.append(time.perf_counter() - t0)
                    if time.time() < end:  # tasks started within the window
                        done += 1
                if train_s:
                    next_start = max(next_start + train_s, time.time())
                    await asyncio.sleep(max(0.0, next_start - time.time()))
                results.append(report_of(task, worker_id))
            if results:  # what it finished goes in; the rest of its lease is left unrun
                req = pb.LeaseTasksRequest(worker_id=worker_id, max_tasks=0, call_id=call_id + 1)
                req.results.extend(results)
                await stub.lease_tasks(req, metadata=auth)
                reported += len(results)
        except grpc.RpcError as e:
            errors.append(f"{e.code().name}: {e.details()}")
        latencies.extend(lat)
        waits.extend(wait)
        return done, reported

    async def main():
        ready, all_ready = [0], asyncio.Event()
        loop = asyncio.get_running_loop()
        go = loop.create_future()
        tasks = [asyncio.ensure_future(worker(i, ready, all_ready, go)) for i in range(n)]
        waiter = asyncio.ensure_future(all_ready.wait())
        await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        ready_q.put(len(errors))
        start_at, ramp, seconds = await loop.run_in_executor(None, go_q.get)
        go.set_result((start_at, ramp, seconds))

        async def cpu_in_window() -> float:
            await asyncio.sleep(max(0.0, start_at + ramp - time.time()))
            cpu0 = time.process_time()
            await asyncio.sleep(seconds)
            return time.process_time() - cpu0

        window_cpu = asyncio.ensure_future(cpu_in_window())
        results = await asyncio.gather(*tasks, return_exceptions=True)
        cpu = await window_cpu
        for r in results:
            if isinstance(r, BaseException):
                errors.append(f"{type(r).__name__}: {r}")
        ok = [r for r in results if not isinstance(r, BaseException)]
        return sum(r[0] for r in ok), sum(r[1] for r in ok), cpu

    done, reported, cpu = asyncio.run(main())
    result_q.put((done, reported, cpu, latencies, waits, errors))


# --------------------------------------------------------------------------------------- driver
def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100.0 * len(s)) - 1))]


def measure(workers: int, mode: str, args) -> dict:
    ctx = mp.get_context("spawn")
    out_q, ctl_q, ready_q, result_q = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    num_tasks = int(args.seconds * 30000) + 10 * workers * max(args.lease, 1) + 1000
    profile = ""
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        profile = os.path.join(args.profile, f"master-{workers}-{mode}.prof")
    master = ctx.Process(target=serve_master, args=(out_q, ctl_q, num_tasks, profile), daemon=True)
    master.start()
    _, port, rss_idle = out_q.get(timeout=120)
    train_s = workers / args.paced_rate if mode == "paced" else 0.0
    # grpc.aio's cost per event grows with the channels of its process: 5,000 in one took
    # minutes to connect and drained at ~10 channels/s when closing, so no process gets
    # more than --workers_per_process of them.
    nproc = min(max(args.processes, math.ceil(workers / args.workers_per_process)), workers)
    go_qs, procs, first = [], [], 0
    for k in range(nproc):
        n = workers // nproc + (1 if k < workers % nproc else 0)
        go_q = ctx.Queue()
        p = ctx.Process(
            target=client_process,
            args=(
                port,
                first,
                n,
                args.protocol,
                args.lease,
                train_s,
                args.client_nice,
                ready_q,
                go_q,
                result_q,
            ),
            daemon=True,
        )
        p.start()
        procs.append(p)
        go_qs.append(go_q)
        first += n
    try:
        for _ in procs:
            ready_q.get(timeout=600)  # 10,000 workers take a while to connect
        start_at = time.time() + 0.5
        # Paced workers start spread over their period (a lease's tasks with leases): the
        # window opens when all have started.
        ramp = train_s * (args.lease if args.protocol == "lease" else 1)
        ctl_q.put(("window", start_at + ramp, args.seconds))
        for q in go_qs:
            q.put((start_at, ramp, args.seconds))
        done = reported = 0
        client_cpu = 0.0
        latencies: list[float] = []
        waits: list[float] = []
        errors: list[str] = []
        for _ in procs:
            d, r, cpu, lat, wait, errs = result_q.get(timeout=ramp + args.seconds + 600)
            done, reported, client_cpu = done + d, reported + r, client_cpu + cpu
            latencies.extend(lat)
            waits.extend(wait)
            errors.extend(errs)
        ctl_q.put("clients done")
        _, accounted, master_cpu, rss_start, rss_end = out_q.get(timeout=60)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        master.join(30)
        if master.is_alive():
            master.kill()
    if errors:
        raise RuntimeError(f"{workers} workers, {mode}: {len(errors)} errors, first: {errors[0]}")
    if accounted != reported:
        raise RuntimeError(
            f"{workers} workers, {mode}: the master accounted {accounted} of {reported} "
            "reported tasks"
        )
    return {
        "workers": workers,
        "mode": mode,
        "tasks_per_s": round(done / args.seconds, 1),
        "get_p50_ms": round(percentile(latencies, 50) * 1e3, 3),
        "get_p99_ms": round(percentile(latencies, 99) * 1e3, 3),
        "wait_p50_ms": round(percentile(waits, 50) * 1e3, 3),
        "wait_p99_ms": round(percentile(waits, 99) * 1e3, 3),
        "calls_per_task": round(len(latencies) / max(len(waits), 1), 3),
        "master_cores": round(master_cpu / args.seconds, 3),
        "tasks_per_master_cpu_s": round(done / max(master_cpu, 1e-9), 1),
        "client_cores": round(client_cpu / args.seconds, 3),
        "client_processes": nproc,
        "master_rss_mib": round(rss_start / 2**20, 1),
        "rss_per_worker_kib": round((rss_start - rss_idle) / workers / 1024, 1),
        "rss_change_per_1k_tasks_kib": round((rss_end - rss_start) / max(done, 1) * 1000 / 1024, 1),
        "train_s_per_task": round(train_s, 4),
        "ramp_s": round(ramp, 2),
    }


def plot(points: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(19, 4.5))
    styles = {"saturated": "o-", "paced": "s--"}
    for mode in MODES:
        pts = [p for p in points if p["mode"] == mode]
        if not pts:
            continue
        x = [p["workers"] for p in pts]
        axes[0].plot(x, [p["tasks_per_s"] for p in pts], styles[mode], label=mode)
        axes[1].plot(x, [p["get_p99_ms"] for p in pts], styles[mode], label=f"{mode} call p99")
        wait99 = [p["wait_p99_ms"] for p in pts]
        axes[1].plot(x, wait99, styles[mode], alpha=0.6, label=f"{mode} wait p99")
        axes[2].plot(x, [p["tasks_per_master_cpu_s"] for p in pts], styles[mode], label=mode)
        axes[3].plot(x, [p["rss_per_worker_kib"] for p in pts], styles[mode], label=mode)
    axes[0].axhline(TARGET_TASKS_PER_S, color="grey", lw=1, ls=":", label="target")
    axes[1].axhline(TARGET_P99_MS, color="grey", lw=1, ls=":", label="p99 target")
    for ax, ylabel in zip(
        axes,
        (
            "tasks/s",
            "p99: call returning tasks, worker without a task (ms)",
            "tasks per master CPU-second",
            "master RSS per worker (KiB)",
        ),
    ):
        ax.set_xscale("log")
        ax.set_xlabel("simulated workers")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[1].set_yscale("log")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--workers", default="1,10,100,300,1000,3000,10000", help="comma-separated counts"
    )
    p.add_argument("--seconds", type=float, default=5.0, help="measurement window per point")
    p.add_argument("--processes", type=int, default=2, help="client processes (at least)")
    p.add_argument(
        "--workers_per_process",
        type=int,
        default=500,
        help="most simulated workers per client process (more processes for more workers)",
    )
    p.add_argument("--protocol", choices=PROTOCOLS, default="lease")
    p.add_argument(
        "--lease",
        type=int,
        default=DEFAULT_LEASE_TASKS,
        help=f"tasks asked for per lease call (--protocol lease; default {DEFAULT_LEASE_TASKS}, "
        "the worker's)",
    )
    p.add_argument("--modes", default="saturated,paced", help="saturated, paced or both")
    p.add_argument(
        "--paced_rate", type=float, default=2200.0, help="tasks/s the paced workers offer"
    )
    p.add_argument(
        "--client_nice",
        type=int,
        default=10,
        help="nice increment of the client processes: they stand in for workers on other "
        "hosts, so they get the CPU the master leaves (default 10; 0 = equal shares)",
    )
    p.add_argument("--plot", default="", help="write a PNG of the curves here")
    p.add_argument(
        "--profile", default="", help="directory: cProfile the master's event loop per point"
    )
    args = p.parse_args(argv)
    try:
        workers = [int(w) for w in args.workers.split(",")]
    except ValueError:
        p.error(f"--workers must be comma-separated integers, got {args.workers!r}")
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in modes) or not modes:
        p.error(f"--modes must name some of {', '.join(MODES)}, got {args.modes!r}")
    if any(w < 1 for w in workers):
        p.error("--workers must all be >= 1")
    if (
        min(args.processes, args.workers_per_process, args.lease) < 1
        or min(args.seconds, args.paced_rate) <= 0
    ):
        p.error(
            "--processes, --workers_per_process, --seconds, --paced_rate and --lease must be "
            "positive"
        )
    os.environ["PYTHONPATH"] = common.python_env()["PYTHONPATH"]  # for the spawned processes

    points = [measure(w, m, args) for w in workers for m in modes]
    lease_note = f" of {args.lease}" if args.protocol == "lease" else ""
    header = list(points[0].keys())
    common.print_table(
        f"Master dispatch vs workers ({args.protocol}{lease_note}, {args.seconds:g} s per point, "
        f"{os.cpu_count()} CPUs shared by master and client processes)",
        header,
        [[pt[h] for h in header] for pt in points],
    )
    top = max(workers)
    paced = [pt for pt in points if pt["workers"] == top and pt["mode"] == "paced"]
    at_top = paced[0] if paced else [pt for pt in points if pt["workers"] == top][0]
    summary = {
        "benchmark": "workers_sweep",
        "protocol": args.protocol,
        "lease": args.lease if args.protocol == "lease" else 1,
        "seconds": args.seconds,
        "cpus": os.cpu_count(),
        "paced_rate": args.paced_rate,
        "target_tasks_per_s": TARGET_TASKS_PER_S,
        "target_p99_ms": TARGET_P99_MS,
        "max_workers": top,
        "tasks_per_s_at_max": at_top["tasks_per_s"],
        "get_p99_ms_at_max": at_top["get_p99_ms"],
        "wait_p99_ms_at_max": at_top["wait_p99_ms"],
        "targets_met": at_top["tasks_per_s"] >= TARGET_TASKS_PER_S
        and max(at_top["get_p99_ms"], at_top["wait_p99_ms"]) <= TARGET_P99_MS,
        "points": points,
    }
    if args.plot:
        plot(
            points,
            args.plot,
            f"Master dispatch vs workers ({args.protocol}{lease_note}, {os.cpu_count()}-core machine)",
        )
    common.print_json(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
