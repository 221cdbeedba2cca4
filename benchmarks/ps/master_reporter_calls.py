"""The cost to the PS of `MasterReporter.report_version` (its gradient pushes call it) while
the master cannot answer, against putting the same values into a plain bounded
`queue.Queue` (the floor of a non-blocking hand-off), in one run.

    python benchmarks/ps/master_reporter_calls.py     # [--calls 1000] [--repeats 9]

Two masters that cannot answer: one at a loopback port nobody listens on, and a real gRPC
master (127.0.0.1, a free port) holding the first report without answering; each round makes
``--calls`` calls per case. The table shows the median per round, calls/s and the ratio
holding master / plain queue, with the load average before and after; the last line is JSON.
This was a test's "10 calls in < 0.5 s"; the test now asserts that calls return while the
master holds the RPC.
"""
from __future__ import annotations

import argparse
import os
import queue
import socket
import sys
import threading
from concurrent import futures

_HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.dirname(_HERE), os.path.join(_HERE, "..", "..", "src", "python")):
    if os.path.abspath(_path) not in sys.path:
        sys.path.insert(0, os.path.abspath(_path))

import grpc  # noqa: E402
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc  # noqa: E402
from elasticdl.ps.master_reporter import MasterReporter  # noqa: E402
from google.protobuf import empty_pb2  # noqa: E402
from interleaved import interleaved, load_average, print_summary, summary  # noqa: E402

MAX_PENDING = 64  # MasterReporter's default


class _HoldingMaster(pb_grpc.MasterServicer):
    def __init__(self):
        self.release = threading.Event()

    def report_version(self, request, context):
        self.release.wait(600)
        return empty_pb2.Empty()


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args(argv)
    load_before = load_average()

    master = _HoldingMaster()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_MasterServicer_to_server(master, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    holding = MasterReporter(f"127.0.0.1:{port}", ps_id=0, timeout_s=600, max_pending=MAX_PENDING)
    unreachable = MasterReporter(
        f"127.0.0.1:{_unused_port()}", ps_id=1, timeout_s=1.0, max_pending=MAX_PENDING
    )
    plain: queue.Queue = queue.Queue(maxsize=MAX_PENDING)

    def to_queue():
        for version in range(args.calls):
            try:
                plain.put_nowait(version)
            except queue.Full:
                pass

    def calls(reporter):
        return lambda: [reporter.report_version(v) for v in range(args.calls)]

    def empty_queue(name):
        if name == "plain queue":  # the reporters' threads drain theirs (or drop the excess)
            while not plain.empty():
                plain.get_nowait()

    try:
        seconds = interleaved(
            {
                "holding master": calls(holding),
                "unreachable master": calls(unreachable),
                "plain queue": to_queue,
            },
            args.repeats,
            before_each=empty_queue,
        )
    finally:
        master.release.set()
        holding.close(timeout_s=10)
        unreachable.close(timeout_s=10)
        server.stop(0)
    result = summary(
        "master_reporter_calls",
        seconds,
        ("holding master", "plain queue"),
        load_before,
        calls_per_round=args.calls,
        max_pending=MAX_PENDING,
    )
    print_summary(result, per=(args.calls, "calls"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
