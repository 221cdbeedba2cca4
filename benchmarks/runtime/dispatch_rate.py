"""Master dispatch rate: tasks/s that a real master gRPC server hands out and accounts for
when 64 clients hammer it concurrently.

    python benchmarks/runtime/dispatch_rate.py [--clients 64] [--processes 4] [--seconds 5]

A "task" is one task handed out and its result reported (with exec counters), as the worker
does it: by default one `report_task_result_and_get_task` call per task (report the last task,
get the next), and, measured in the same run for comparison, the older two calls `get_task`
then `report_task_result` (`--protocol` picks the headline one). Over 127.0.0.1 to the real
`MasterServicer` + `TaskManager` served by `create_master_server` (the master's own server:
asyncio by default, message limits), in its own process. The clients are `--processes` processes of
`clients / processes` clients each, every client with its own channel, like separate workers:
grpc.aio coroutines by default (`--client asyncio`: cheap, so the CPU goes to the master being
measured), or blocking threads (`--client threads`).
The master gets enough training tasks never to run dry during the measurement.

Repeats report the median; the JSON line gives tasks/s of the headline protocol, its ratio to
the 2,000 tasks/s target, and the other protocol's tasks/s. On a machine with few cores the
clients compete with the master for CPU, so the number is a lower bound of what the master
alone sustains.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

TARGET = 2000.0


# ---------------------------------------------------------------------------------------- master
# The master authenticates every call, as in a job (elasticdl.common.auth).
BENCH_SECRET = "dispatch-rate-benchmark-secret"


def serve_master(
    port_queue, window_queue, stop_event, num_tasks: int, use_asyncio: bool, journal_dir: str = ""
) -> None:
    """The master side, in its own process: real servicer, task manager and gRPC server
    (with ``journal_dir``, the task manager journals into it as a job's master does)."""
    import logging

    from elasticdl.master.server import create_master_server
    from elasticdl.master.servicer import MasterServicer
    from elasticdl.master.task_manager import TaskManager, TaskManagerConfig

    logging.basicConfig(level=logging.WARNING)
    tm = TaskManager(
        TaskManagerConfig(records_per_task=1, num_epochs=1, minibatch_size=1),
        training_shards=[("bench-shard", 0, num_tasks)],
    )
    if journal_dir:
        from elasticdl.master.journal import Journal

        journal = Journal(journal_dir, "tasks")
        journal.open()
        tm.attach_journal(journal)
    servicer = MasterServicer(tm)
    server, port = create_master_server(
        servicer, 0, bind_host="127.0.0.1", use_asyncio=use_asyncio, secret=BENCH_SECRET
    )
    port_queue.put(port)
    # The driver sends the measurement window; the master's own CPU time over it tells what
    # the master costs per task, whatever the clients cost.
    start_at, seconds = port_queue_window(window_queue)
    time.sleep(max(0.0, start_at - time.time()))
    cpu0 = time.process_time()
    time.sleep(seconds)
    cpu = time.process_time() - cpu0
    stop_event.wait()
    port_queue.put((tm.summary().records_trained, cpu))
    server.stop(0)


def port_queue_window(q):
    while True:
        item = q.get()
        if isinstance(item, tuple) and item[0] == "window":
            return item[1], item[2]


# ---------------------------------------------------------------------------------------- clients
def client_process(
    port: int,
    threads: int,
    first_worker_id: int,
    start_at: float,
    seconds: float,
    result_queue,
    combined: bool = True,
) -> None:
    import grpc
    from elasticdl.proto import elasticdl_pb2 as pb
    from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc

    counts = [0] * threads
    errors = []

    def run(i: int) -> None:
        worker_id = first_worker_id + i
        from elasticdl.common.auth import authenticated_channel

        raw = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(raw).result(timeout=30)
        channel = authenticated_channel(raw, BENCH_SECRET)  # as every job's clients do
        stub = pb_grpc.MasterStub(channel)
        get_req = pb.GetTaskRequest(worker_id=worker_id)
        while time.time() < start_at:
            time.sleep(0.001)
        end = start_at + seconds
        n = 0
        try:
            if combined:
                # Each call reports the previous task and gets the next; the last one is
                # reported alone after the window.
                req = pb.ReportAndGetTaskRequest(next=get_req)
                task = stub.report_task_result_and_get_task(req)
                while task.task_id != 0 and time.time() < end:
                    req.result.CopyFrom(_report(pb, task, worker_id))
                    task = stub.report_task_result_and_get_task(req)
                    n += 1
                if task.task_id != 0:
                    stub.report_task_result(_report(pb, task, worker_id))
                    n += 1
                else:
                    errors.append("master ran out of tasks")
            while not combined and time.time() < end:
                task = stub.get_task(get_req)
                if task.task_id == 0:
                    errors.append("master ran out of tasks")
                    break
                stub.report_task_result(_report(pb, task, worker_id))
                n += 1
        except grpc.RpcError as e:
            errors.append(f"{e.code().name}: {e.details()}")
        finally:
            counts[i] = n
            channel.close()

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    result_queue.put((sum(counts), errors))


def _report(pb, task, worker_id: int):
    report = pb.ReportTaskResultRequest(task_id=task.task_id, worker_id=worker_id)
    report.exec_counters["records"] = task.shard.end - task.shard.start
    return report


def async_client_process(
    port: int,
    clients: int,
    first_worker_id: int,
    start_at: float,
    seconds: float,
    result_queue,
    combined: bool = True,
) -> None:
    """Like `client_process`, but the clients are coroutines of one grpc.aio event loop (still
    one channel each): a blocking client thread costs more CPU per call than the master's
    handler, and on a small machine that CPU is taken from the master being measured."""
    import asyncio

    import grpc
    from elasticdl.common.auth import TOKEN_METADATA_KEY
    from elasticdl.proto import elasticdl_pb2 as pb
    from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc

    errors = []
    AUTH = ((TOKEN_METADATA_KEY, BENCH_SECRET),)

    async def run(i: int) -> int:
        worker_id = first_worker_id + i
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.MasterStub(channel)
            await asyncio.wait_for(channel.channel_ready(), timeout=30)
            get_req = pb.GetTaskRequest(worker_id=worker_id)
            await asyncio.sleep(max(0.0, start_at - time.time()))
            end = start_at + seconds
            n = 0
            try:
                if combined:
                    req = pb.ReportAndGetTaskRequest(next=get_req)
                    task = await stub.report_task_result_and_get_task(req, metadata=AUTH)
                    while task.task_id != 0 and time.time() < end:
                        req.result.CopyFrom(_report(pb, task, worker_id))
                        task = await stub.report_task_result_and_get_task(req, metadata=AUTH)
                        n += 1
                    if task.task_id != 0:
                        await stub.report_task_result(_report(pb, task, worker_id), metadata=AUTH)
                        n += 1
                    else:
                        errors.append("master ran out of tasks")
                while not combined and time.time() < end:
                    task = await stub.get_task(get_req, metadata=AUTH)
                    if task.task_id == 0:
                        errors.append("master ran out of tasks")
                        break
                    await stub.report_task_result(_report(pb, task, worker_id), metadata=AUTH)
                    n += 1
            except grpc.RpcError as e:
                errors.append(f"{e.code().name}: {e.details()}")
            return n

    async def main() -> int:
        return sum(await asyncio.gather(*(run(i) for i in range(clients))))

    result_queue.put((asyncio.run(main()), errors))


def measure(
    clients: int,
    processes: int,
    seconds: float,
    use_asyncio: bool = True,
    async_clients: bool = True,
    combined: bool = True,
    journal_dir: str = "",
) -> dict:
    ctx = mp.get_context("spawn")
    port_q, result_q, window_q, stop = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Event()
    # Enough tasks for a rate far above the target.
    num_tasks = int(seconds * 20000) + 10000
    master = ctx.Process(
        target=serve_master,
        args=(port_q, window_q, stop, num_tasks, use_asyncio, journal_dir),
        daemon=True,
    )
    master.start()
    port = port_q.get(timeout=60)
    per_proc = [
        clients // processes + (1 if i < clients % processes else 0) for i in range(processes)
    ]
    start_at = time.time() + 3.0 + 0.5 * processes  # every client connected and waiting
    window_q.put(("window", start_at, seconds))
    procs = []
    first = 0
    for n in per_proc:
        p = ctx.Process(
            target=async_client_process if async_clients else client_process,
            args=(port, n, first, start_at, seconds, result_q, combined),
            daemon=True,
        )
        p.start()
        procs.append(p)
        first += n
    total, errors = 0, []
    for _ in procs:
        n, errs = result_q.get(timeout=seconds + 120)
        total += n
        errors.extend(errs)
    for p in procs:
        p.join(30)
    stop.set()
    accounted, master_cpu = port_q.get(timeout=30)
    master.join(30)
    if errors:
        raise RuntimeError(f"{len(errors)} client errors, first: {errors[0]}")
    return {
        "tasks": total,
        "accounted": accounted,
        "tasks_per_s": total / seconds,
        "master_cpu_s": master_cpu,
        "tasks_per_master_cpu_s": total / max(master_cpu, 1e-9),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--processes", type=int, default=4, help="client processes sharing the clients")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--server",
        choices=["asyncio", "threads"],
        default="asyncio",
        help="the master's gRPC server: asyncio (default) or the thread-pool one",
    )
    p.add_argument(
        "--protocol",
        choices=["combined", "two_calls"],
        default="combined",
        help="headline protocol: report_task_result_and_get_task (combined, default) or "
        "get_task + report_task_result (two_calls); the other is measured too",
    )
    p.add_argument(
        "--client",
        choices=["asyncio", "threads"],
        default="asyncio",
        help="clients as grpc.aio coroutines (default, cheaper) or as blocking threads",
    )
    args = p.parse_args(argv)
    if args.clients < 1 or not 1 <= args.processes <= args.clients:
        p.error("--clients must be >= 1 and --processes in [1, clients]")
    os.environ["PYTHONPATH"] = common.python_env()["PYTHONPATH"]  # for the spawned processes

    protocols = [args.protocol] + [x for x in ("combined", "two_calls") if x != args.protocol]
    rows = []
    rates = {x: [] for x in protocols}
    capacity = {x: [] for x in protocols}
    for r in range(args.repeats):
        for protocol in protocols:  # interleaved, so both see the same machine load
            res = measure(
                args.clients,
                args.processes,
                args.seconds,
                args.server == "asyncio",
                args.client == "asyncio",
                protocol == "combined",
            )
            if res["accounted"] != res["tasks"]:
                raise RuntimeError(
                    f"{protocol}: the master accounted {res['accounted']} of {res['tasks']} "
                    "reported tasks"
                )
            rates[protocol].append(res["tasks_per_s"])
            capacity[protocol].append(res["tasks_per_master_cpu_s"])
            rows.append(
                [
                    r + 1,
                    protocol,
                    res["tasks"],
                    res["accounted"],
                    res["tasks_per_s"],
                    res["master_cpu_s"] / args.seconds,
                    res["tasks_per_master_cpu_s"],
                ]
            )
    common.print_table(
        f"Master dispatch: tasks handed out and reported, {args.clients} clients in "
        f"{args.processes} processes ({args.client}), {args.server} server, "
        f"{args.seconds:.0f} s per run",
        [
            "run",
            "protocol",
            "tasks",
            "accounted by master",
            "tasks/s",
            "master cores busy",
            "tasks per master CPU s",
        ],
        rows,
    )
    median = {x: common.median(rates[x]) for x in protocols}
    rate = median[args.protocol]
    other = protocols[1]
    print(
        f"median tasks/s: {args.protocol} {rate:.0f}, {other} {median[other]:.0f} "
        f"({rate / median[other]:.2f}x); ratio {args.protocol} to target {TARGET:.0f}: "
        f"{rate / TARGET:.2f}"
    )
    common.print_json(
        {
            "benchmark": "dispatch_rate",
            "clients": args.clients,
            "server": args.server,
            "client": args.client,
            "protocol": args.protocol,
            "tasks_per_s": round(rate, 1),
            "target": TARGET,
            "ratio": round(rate / TARGET, 3),
            f"{other}_tasks_per_s": round(median[other], 1),
            "repeats": args.repeats,
            "tasks_per_master_cpu_s": round(common.median(capacity[args.protocol]), 1),
            f"{other}_tasks_per_master_cpu_s": round(common.median(capacity[other]), 1),
            "cpus": os.cpu_count(),
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
