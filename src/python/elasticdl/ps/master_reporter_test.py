"""MasterReporter never makes the PS wait on the master: reports are queued and sent by its own
thread, and dropped when the queue is full. Asserted by what happens (calls return while the
master holds the RPC), not by a clock; the cost of a call is a benchmark
(benchmarks/ps/master_reporter_calls.py)."""
import socket
import threading
import time
from concurrent import futures

import grpc
import pytest
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc
from elasticdl.ps.load_meter import LoadMeter, MeteredLock
from elasticdl.ps.master_reporter import MasterReporter
from google.protobuf import empty_pb2

HANG_GUARD_S = 60  # only a hung test waits this long; no outcome depends on it


class HoldingMaster(pb_grpc.MasterServicer):
    """A real gRPC master whose report_version does not answer until released."""

    def __init__(self):
        self.received = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def report_version(self, request, context):
        self.received.append(request.model_version)
        self.entered.set()
        self.release.wait(HANG_GUARD_S)
        return empty_pb2.Empty()


@pytest.fixture
def holding_master():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = HoldingMaster()
    pb_grpc.add_MasterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        servicer.release.set()
        server.stop(0)


def test_reports_return_while_the_master_holds_the_rpc(holding_master):
    master, addr = holding_master
    reporter = MasterReporter(addr, ps_id=1, timeout_s=HANG_GUARD_S, max_pending=2)
    reporter.report_version(0)
    assert master.entered.wait(HANG_GUARD_S), "the report never reached the master"
    # The master is inside report_version(0) and answers nothing until released: a caller
    # that awaited an RPC could not get past the next call.
    returned = threading.Event()

    def caller():
        for version in range(1, 10):  # more than max_pending: the extra ones are dropped
            reporter.report_version(version)
        returned.set()

    threading.Thread(target=caller, daemon=True).start()
    assert returned.wait(HANG_GUARD_S), "report_version blocked on the master"
    assert master.received == [0] and reporter.reported == []  # the RPC is still held

    master.release.set()
    reporter.close(timeout_s=HANG_GUARD_S)
    # Version 0 was in flight, 1 and 2 filled the queue, 3-9 were dropped.
    assert master.received == [0, 1, 2]
    assert reporter.reported == [0, 1, 2]


def test_an_unreachable_master_costs_the_reports_not_the_caller():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reporter = MasterReporter(f"127.0.0.1:{port}", ps_id=1, timeout_s=0.5, max_pending=2)
    for version in range(10):
        reporter.report_version(version)  # raises nothing
    reporter.close(timeout_s=HANG_GUARD_S)
    assert reporter.reported == []
    assert not reporter._thread.is_alive()


class LoadMaster(pb_grpc.MasterServicer):
    def __init__(self):
        self.loads = []
        self.got = threading.Event()

    def report_ps_load(self, request, context):
        self.loads.append(request)
        self.got.set()
        return empty_pb2.Empty()


def test_the_load_is_reported_while_no_version_is():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    master = LoadMaster()
    pb_grpc.add_MasterServicer_to_server(master, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    lock = MeteredLock()
    reporter = MasterReporter(
        f"127.0.0.1:{port}", ps_id=3, load_meter=LoadMeter(lock, cpus=1), load_interval_s=0.05
    )
    try:
        with lock:
            pass
        assert master.got.wait(HANG_GUARD_S), "no load report reached the master"
    finally:
        reporter.close(timeout_s=HANG_GUARD_S)
        server.stop(0)
    load = master.loads[0]
    assert load.ps_id == 3 and load.window_seconds > 0
    assert 0 <= load.lock_busy_fraction <= 1 and load.cpu_fraction >= 0
    # The PS process's own CPU seconds so far: what the master sizes auto jobs by on pods.
    assert 0 < load.cpu_seconds <= time.process_time() + 1
    assert sum(x.requests for x in master.loads) == 1
