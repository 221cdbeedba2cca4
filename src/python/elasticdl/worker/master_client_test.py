"""MasterClient against the real master servicer over gRPC on 127.0.0.1."""

import time
from concurrent import futures

import grpc
import pytest
from elasticdl.common.process_cpu import PROCESS_CPU_MS_COUNTER
from elasticdl.master.servicer import MasterServicer
from elasticdl.master.task_manager import TaskManager, TaskManagerConfig
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc
from elasticdl.worker.master_client import MasterClient


class _NoLeaseMasterServicer(MasterServicer):
    """A master from before lease_tasks: the generated base answers UNIMPLEMENTED, as an
    older master binary would."""

    lease_tasks = pb_grpc.MasterServicer.lease_tasks


class _OldMasterServicer(_NoLeaseMasterServicer):
    """A master from before report_task_result_and_get_task too."""

    report_task_result_and_get_task = pb_grpc.MasterServicer.report_task_result_and_get_task


def _drain(client: MasterClient) -> list:
    """Run the job by report_and_get_task only; the shard starts in the order handed out."""
    starts, task = [], client.report_and_get_task(0)
    while task.type == pb.TRAINING:
        starts.append(task.shard.start)
        task = client.report_and_get_task(
            task.task_id, exec_counters={"records": task.shard.end - task.shard.start}
        )
    assert task.type == pb.NONE and task.task_id == 0
    return starts


class _CallCounting:
    """Counts the master's calls by method name (a server interceptor)."""

    def __init__(self):
        self.calls = {}

    def intercept_service(self, continuation, details):
        name = details.method.rsplit("/", 1)[-1]
        self.calls[name] = self.calls.get(name, 0) + 1
        return continuation(details)


def _serve(servicer_cls, tasks=3, epochs=2):
    tm = TaskManager(
        TaskManagerConfig(records_per_task=4, num_epochs=epochs),
        training_shards=[("t", 0, 4 * tasks)],
    )
    counting = _CallCounting()
    server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[counting])
    pb_grpc.add_MasterServicer_to_server(servicer_cls(tm), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return tm, server, port, counting.calls


@pytest.mark.parametrize(
    "servicer_cls,leasing,combined",
    [
        (MasterServicer, True, True),
        (_NoLeaseMasterServicer, False, True),
        (_OldMasterServicer, False, False),
    ],
)
def test_report_and_get_task_runs_the_job_with_new_and_old_masters(servicer_cls, leasing, combined):
    tm, server, port, calls = _serve(servicer_cls)
    client = MasterClient(f"127.0.0.1:{port}", worker_id=4, retry_timeout=5)
    try:
        assert _drain(client) == [0, 4, 8, 0, 4, 8]
        summary = tm.summary()
        assert summary.tasks_done == 6 and summary.records_trained == 24
        # Against an older master the client fell back once, and stays there.
        assert (client.leasing, client._combined) == (leasing, combined)
        # The old calls keep working beside the new ones.
        assert client.get_task().type == pb.NONE
    finally:
        client.close()
        server.stop(0)
    if leasing:  # a lease per epoch (one worker: its share is all 3), NONE, NONE again
        assert calls == {"lease_tasks": 4}, calls


def test_results_wait_for_the_next_lease_and_failures_and_flushes_go_at_once():
    tm, server, port, calls = _serve(MasterServicer, tasks=8, epochs=1)
    client = MasterClient(f"127.0.0.1:{port}", worker_id=1, retry_timeout=5, lease_tasks=4)
    try:
        a = client.get_task()
        assert len(client.leased_task_ids()) == 3 and tm.summary().tasks_doing == 4
        b = client.report_and_get_task(a.task_id, exec_counters={"records": 4})
        assert tm.summary().tasks_done == 0  # the success waits for the next lease call
        assert calls == {"lease_tasks": 1}
        c = client.report_and_get_task(b.task_id, err_message="boom")
        s = tm.summary()  # a failure goes at once, with the success that waited
        assert s.tasks_done == 1 and s.tasks_retried == 1 and calls == {"lease_tasks": 2}
        d = client.report_and_get_task(c.task_id)
        assert client.leased_task_ids() == [] and tm.summary().tasks_done == 1
        client.report_task_result(d.task_id)  # "send it now": one call
        assert tm.summary().tasks_done == 3 and calls == {"lease_tasks": 3}
        client.flush_results()  # nothing waits: no call
        assert calls == {"lease_tasks": 3}
    finally:
        client.close()
        server.stop(0)


def test_a_lease_answer_lost_and_retried_gets_the_same_tasks():
    """The client numbers each lease call and a retry keeps the number: the master answers
    a retry (its first answer lost) with the same tasks and applies the results once."""
    tm, server, port, _ = _serve(MasterServicer, tasks=8, epochs=1)
    client = MasterClient(f"127.0.0.1:{port}", worker_id=1, retry_timeout=5, lease_tasks=2)
    sent = []
    real_call = client._call

    def call_twice(name, request):
        first = real_call(name, request)  # this answer is "lost"
        sent.append(first)
        return real_call(name, request)

    try:
        t1 = client.get_task()
        t2 = client.report_and_get_task(t1.task_id)
        client._call = call_twice
        t3 = client.report_and_get_task(t2.task_id)
        assert [t.task_id for t in sent[0].tasks] == [t3.task_id] + client.leased_task_ids()
        s = tm.summary()
        assert s.tasks_done == 2 and s.tasks_doing == 2 and s.stale_reports == 0
    finally:
        client.close()
        server.stop(0)


def test_a_training_loss_travels_as_a_task_metric_not_a_counter():
    client = MasterClient("127.0.0.1:1", worker_id=2)  # builds a request; connects nowhere
    try:
        req = client._result_request(7, "", {"records": 4, "loss": 0.25})
    finally:
        client.close()
    assert req.worker_id == 2
    counters = dict(req.exec_counters)
    # Every report also carries this process's CPU so far (the master sizes auto jobs by it).
    cpu_ms = counters.pop(PROCESS_CPU_MS_COUNTER)
    assert 0 < cpu_ms <= 1000 * (time.process_time() + 1)
    assert counters == {"records": 4} and dict(req.task_metrics) == {"loss": 0.25}


def test_a_master_unreachable_for_long_is_called_again_over_a_new_channel(monkeypatch):
    """The first channel goes on failing (as one stuck on a dead master's address does); once
    the master has been unreachable for REBUILD_CHANNEL_AFTER_S, the call goes on over a new
    channel, which resolves the name afresh (here: reaches the live master)."""
    import socket

    from elasticdl.worker import master_client

    _, server, port, calls = _serve(MasterServicer)
    with socket.socket() as s:  # a port nothing listens on: every call is UNAVAILABLE
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    targets = [f"127.0.0.1:{dead}", f"127.0.0.1:{port}"]
    real_build_channel = master_client.build_channel
    built = []

    def build_channel(addr, secret=None, tls_config=None):
        built.append(targets[min(len(built), 1)])
        return real_build_channel(built[-1], secret, tls_config)

    monkeypatch.setattr(master_client, "build_channel", build_channel)
    monkeypatch.setattr(master_client, "REBUILD_CHANNEL_AFTER_S", 0.5)
    client = MasterClient("elasticdl-job-master.ns.svc:50001", worker_id=1, retry_timeout=20)
    try:
        task = client.get_task()
        assert task.type == pb.TRAINING
        assert built == targets  # one new channel, not one per retry
        assert client.addr == "elasticdl-job-master.ns.svc:50001"
    finally:
        client.close()
        server.stop(None)


def test_channels_replaced_through_a_long_outage_are_closed_once_no_call_can_be_on_them(
    monkeypatch,
):
    """A master unreachable for many rebuild periods: each rebuild closes the channels replaced
    longer than a call's deadline ago, so the open ones stay few however long it lasts."""
    from elasticdl.worker import master_client

    class Channel:
        def __init__(self):
            self.closed = False

        def unary_unary(self, *args, **kwargs):
            return None

        def close(self):
            self.closed = True

    built: list[Channel] = []

    def build_channel(addr, secret=None, tls_config=None):
        built.append(Channel())
        return built[-1]

    now = [1000.0]
    monkeypatch.setattr(master_client, "build_channel", build_channel)
    monkeypatch.setattr(master_client.time, "monotonic", lambda: now[0])
    client = MasterClient("master:50001", worker_id=1, rpc_timeout=25.0)
    for step in range(1, 31):  # five minutes unreachable, a new channel every 10 s
        now[0] += master_client.REBUILD_CHANNEL_AFTER_S
        client._rebuild_channel_if_stuck(step * master_client.REBUILD_CHANNEL_AFTER_S)
        open_ = [c for c in built if not c.closed]
        # The current channel and those replaced within the last call deadline (+1 s).
        assert len(open_) <= 2 + int(26 // master_client.REBUILD_CHANNEL_AFTER_S), step
    assert len(built) == 31
    assert all(c.closed for c in built[:-4]) and not any(c.closed for c in built[-4:])
    client.close()
    assert all(c.closed for c in built)
