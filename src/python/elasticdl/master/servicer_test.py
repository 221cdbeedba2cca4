"""MasterServicer over a real gRPC server on 127.0.0.1."""

import grpc
import numpy as np
import pytest
from elasticdl.common.process_cpu import PROCESS_CPU_MS_COUNTER
from elasticdl.common.tensor_utils import ndarray_to_pb
from elasticdl.master.evaluation_service import EvaluationService
from elasticdl.master.job_cpu import CPUReports
from elasticdl.master.server import MasterServerError, create_master_server
from elasticdl.master.servicer import MasterServicer
from elasticdl.master.status_writer import LossHistory
from elasticdl.master.task_manager import TaskManager, TaskManagerConfig
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc


def _mae(labels, predictions):
    return np.abs(labels - predictions)


@pytest.fixture
def master():
    tm = TaskManager(
        TaskManagerConfig(records_per_task=4, num_epochs=2),
        training_shards=[("train", 0, 8)],
        evaluation_shards=[("val", 0, 4)],
    )
    es = EvaluationService(tm, lambda: {"mae": _mae}, evaluation_steps=10)
    servicer = MasterServicer(
        tm,
        es,
        job_status=lambda: pb.JobStatus(
            job_name="unit", phase="Running", tasks_done=tm.summary().tasks_done
        ),
    )
    server, port = create_master_server(servicer, 0, bind_host="127.0.0.1", secret=None)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.MasterStub(channel)
    yield tm, es, stub, port
    channel.close()
    server.stop(0)


def test_training_tasks_epochs_and_job_status(master):
    tm, es, stub, _ = master
    executed = []
    while True:
        task = stub.get_task(pb.GetTaskRequest(worker_id=3))
        if task.type != pb.TRAINING:
            break
        executed.append((task.epoch, task.shard.name, task.shard.start, task.shard.end))
        stub.report_task_result(
            pb.ReportTaskResultRequest(
                task_id=task.task_id, worker_id=3, exec_counters={"records": 4}
            )
        )
    assert executed == [
        (1, "train", 0, 4),
        (1, "train", 4, 8),
        (2, "train", 0, 4),
        (2, "train", 4, 8),
    ]
    # Training done -> the final evaluation task follows.
    assert task.type == pb.EVALUATION and task.shard.name == "val"
    s = tm.summary()
    assert s.records_trained == s.records_expected == 16 and s.exec_counters == {"records": 16}
    assert stub.get_job_status(pb.JobStatusRequest()).tasks_done == 4


def test_failure_requeue_and_stale_report_over_grpc(master):
    tm, _, stub, _ = master
    t = stub.get_task(pb.GetTaskRequest(worker_id=1))
    stub.report_task_result(
        pb.ReportTaskResultRequest(task_id=t.task_id, worker_id=1, err_message="oops")
    )
    assert tm.summary().tasks_retried == 1
    t2 = stub.get_task(pb.GetTaskRequest(worker_id=2))
    t_again = stub.get_task(pb.GetTaskRequest(worker_id=2))
    assert t_again.task_id == t.task_id
    # Worker 1 no longer owns it: its late success is ignored without an RPC error.
    stub.report_task_result(pb.ReportTaskResultRequest(task_id=t.task_id, worker_id=1))
    assert tm.summary().stale_reports == 1 and tm.summary().tasks_done == 0
    for task in (t2, t_again):
        stub.report_task_result(pb.ReportTaskResultRequest(task_id=task.task_id, worker_id=2))
    assert tm.summary().tasks_done == 2


def test_version_triggers_evaluation_and_metrics_aggregate(master):
    tm, es, stub, _ = master
    train = stub.get_task(pb.GetTaskRequest(worker_id=0))
    stub.report_version(pb.ReportVersionRequest(model_version=10, ps_id=0))
    ev = stub.get_task(pb.GetTaskRequest(worker_id=1))
    assert ev.type == pb.EVALUATION and ev.model_version == 10
    req = pb.ReportEvaluationMetricsRequest(worker_id=1, task_id=ev.task_id, model_version=10)
    ndarray_to_pb(np.array([1.0, 2.0, 3.0, 4.0], np.float32), req.model_outputs["output"])
    ndarray_to_pb(np.array([1.0, 1.0, 1.0, 1.0], np.float32), req.labels)
    stub.report_evaluation_metrics(req)
    stub.report_task_result(pb.ReportTaskResultRequest(task_id=ev.task_id, worker_id=1))
    assert es.latest.model_version == 10 and es.latest.metrics == {"mae": 1.5}
    # Nothing to hand out right now? Idle workers learn the current model version.
    for _ in range(3):  # the other training tasks of both epochs
        assert stub.get_task(pb.GetTaskRequest(worker_id=5)).type == pb.TRAINING
    wait = stub.get_task(pb.GetTaskRequest(worker_id=6))
    assert wait.type == pb.WAIT and wait.model_version == 10
    del train


def test_unimplemented_rpcs_explain_themselves(master):
    _, _, stub, _ = master
    with pytest.raises(grpc.RpcError) as err:
        stub.get_comm_rank(pb.GetCommRankRequest(worker_host="h"))
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "ParameterServerStrategy" in err.value.details()


def test_port_in_use_is_a_clear_error(master):
    _, _, _, port = master
    with pytest.raises(MasterServerError, match="--port"):
        create_master_server(
            MasterServicer(TaskManager(TaskManagerConfig(1))), port, "127.0.0.1", secret=None
        )


def test_task_reports_carry_the_model_version_without_summing_it():
    tm = TaskManager(
        TaskManagerConfig(records_per_task=4, num_epochs=1), training_shards=[("train", 0, 8)]
    )
    servicer = MasterServicer(tm)
    for version in (7, 5):  # reports may arrive out of order: the newest version wins
        task = servicer.get_task(pb.GetTaskRequest(worker_id=0), None)
        req = pb.ReportTaskResultRequest(task_id=task.task_id, worker_id=0)
        req.exec_counters.update({"records": 4, "model_version": version})
        servicer.report_task_result(req, None)
    assert servicer.model_version == 7
    summary = tm.summary()
    assert summary.records_trained == 8
    assert "model_version" not in summary.exec_counters


def test_training_losses_reach_the_loss_history_over_grpc():
    """A worker's task results carry their mean loss (task_metrics); the master files it under
    the version the worker reported. Failed tasks and results without a loss add nothing."""
    tm = TaskManager(
        TaskManagerConfig(records_per_task=4, num_epochs=1), training_shards=[("train", 0, 16)]
    )
    history = LossHistory()
    servicer = MasterServicer(tm, loss_history=history)
    server, port = create_master_server(servicer, 0, bind_host="127.0.0.1", secret=None)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.MasterStub(channel)
            results = [
                dict(exec_counters={"records": 4, "model_version": 3}, task_metrics={"loss": 2.5}),
                dict(err_message="boom", task_metrics={"loss": 9.0}),
                dict(exec_counters={"records": 4}),
                dict(exec_counters={"records": 4, "model_version": 8}, task_metrics={"loss": 1.25}),
            ]
            for result in results:
                task = stub.get_task(pb.GetTaskRequest(worker_id=1))
                stub.report_task_result(
                    pb.ReportTaskResultRequest(task_id=task.task_id, worker_id=1, **result)
                )
    finally:
        server.stop(0)
    assert history.samples() == [
        {"model_version": 3, "loss": 2.5},
        {"model_version": 8, "loss": 1.25},
    ]
    assert "loss" not in tm.summary().exec_counters


def _report_and_get(stub, worker_id, task_id=0, **result):
    req = pb.ReportAndGetTaskRequest(next=pb.GetTaskRequest(worker_id=worker_id))
    if task_id:
        req.result.CopyFrom(
            pb.ReportTaskResultRequest(task_id=task_id, worker_id=worker_id, **result)
        )
    return stub.report_task_result_and_get_task(req)


def test_report_and_get_task_matches_the_two_calls(master):
    """The combined RPC hands out the same tasks in the same order as get_task +
    report_task_result, accounts every record once and ends in the evaluation task."""
    tm, _, stub, _ = master
    task = _report_and_get(stub, 3)  # nothing to report yet: a plain get_task
    executed = []
    while task.type == pb.TRAINING:
        executed.append((task.epoch, task.shard.start, task.shard.end))
        task = _report_and_get(
            stub, 3, task.task_id, exec_counters={"records": 4, "model_version": 9}
        )
    assert executed == [(1, 0, 4), (1, 4, 8), (2, 0, 4), (2, 4, 8)]
    assert task.type == pb.EVALUATION and task.shard.name == "val"
    s = tm.summary()
    assert s.tasks_done == 4 and s.records_trained == 16 and s.exec_counters == {"records": 16}
    assert stub.get_job_status(pb.JobStatusRequest()).tasks_done == 4
    # The evaluation task can be reported with the old RPC: both paths stay compatible.
    stub.report_task_result(pb.ReportTaskResultRequest(task_id=task.task_id, worker_id=3))
    last = _report_and_get(stub, 3)
    assert last.task_id == 0 and last.type != pb.TRAINING and last.model_version == 9


def test_report_and_get_task_failures_stale_reports_and_wait(master):
    tm, _, stub, _ = master
    t = stub.get_task(pb.GetTaskRequest(worker_id=1))
    # The failure is re-queued (at the back) before the next task is picked.
    nxt = _report_and_get(stub, 1, t.task_id, err_message="oops")
    assert tm.summary().tasks_retried == 1 and nxt.task_id not in (0, t.task_id)
    assert _report_and_get(stub, 2).task_id == t.task_id  # worker 2 now owns the retry
    # Worker 1 no longer owns it: its late report is stale (no error) and it still gets work.
    other = _report_and_get(stub, 1, t.task_id)
    assert tm.summary().stale_reports == 1 and tm.summary().tasks_done == 0
    assert other.type == pb.TRAINING and other.task_id not in (t.task_id, nxt.task_id)
    # Mismatched worker ids are refused before anything is reported.
    req = pb.ReportAndGetTaskRequest(
        result=pb.ReportTaskResultRequest(task_id=other.task_id, worker_id=1),
        next=pb.GetTaskRequest(worker_id=2),
    )
    with pytest.raises(grpc.RpcError) as err:
        stub.report_task_result_and_get_task(req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "worker_id" in err.value.details() and tm.summary().tasks_done == 0


def test_report_and_get_task_with_thread_pool_server():
    """Same semantics under the plain grpc.server (use_asyncio=False)."""
    tm = TaskManager(
        TaskManagerConfig(records_per_task=4, num_epochs=1), training_shards=[("train", 0, 8)]
    )
    server, port = create_master_server(
        MasterServicer(tm), 0, bind_host="127.0.0.1", use_asyncio=False, secret=None
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.MasterStub(channel)
            task, done = _report_and_get(stub, 0), 0
            while task.task_id:
                task = _report_and_get(stub, 0, task.task_id, exec_counters={"records": 4})
                done += 1
        assert done == 2 and task.type == pb.NONE
        assert tm.summary().tasks_done == 2 and tm.summary().records_trained == 8
    finally:
        server.stop(0)


@pytest.mark.parametrize("use_asyncio", [True, False])
def test_only_callers_with_the_job_secret_are_served(use_asyncio):
    from elasticdl.common import auth

    tm = TaskManager(TaskManagerConfig(records_per_task=4), training_shards=[("t", 0, 8)])
    server, port = create_master_server(
        MasterServicer(tm), 0, "127.0.0.1", use_asyncio=use_asyncio, secret="s3cret"
    )
    try:
        for secret in (None, "another-jobs-secret"):
            channel = grpc.insecure_channel(f"127.0.0.1:{port}")
            if secret is not None:
                channel = auth.authenticated_channel(channel, secret)
            with channel:
                stub = pb_grpc.MasterStub(channel)
                with pytest.raises(grpc.RpcError) as err:
                    stub.get_task(pb.GetTaskRequest(worker_id=0))
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                with pytest.raises(grpc.RpcError) as err:
                    stub.report_task_result(pb.ReportTaskResultRequest(task_id=1, err_message="x"))
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert tm.summary().tasks_doing == 0  # nothing was handed out or reported
        channel = auth.authenticated_channel(grpc.insecure_channel(f"127.0.0.1:{port}"), "s3cret")
        with channel:
            task = pb_grpc.MasterStub(channel).get_task(pb.GetTaskRequest(worker_id=0))
        assert task.task_id != 0 and tm.summary().tasks_doing == 1
    finally:
        server.stop(0)


@pytest.mark.parametrize("use_asyncio", [True, False])
def test_a_request_over_the_jobs_cap_is_refused_and_the_task_stays_out(use_asyncio):
    from elasticdl.common import message_caps

    tm = TaskManager(TaskManagerConfig(records_per_task=4), training_shards=[("t", 0, 8)])
    cap = message_caps.master_cap(4, evaluates=False)
    server, port = create_master_server(
        MasterServicer(tm),
        0,
        "127.0.0.1",
        use_asyncio=use_asyncio,
        secret=None,
        max_message_bytes=cap,
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.MasterStub(channel)
            task = stub.get_task(pb.GetTaskRequest(worker_id=0))
            with pytest.raises(grpc.RpcError) as err:
                stub.report_task_result(
                    pb.ReportTaskResultRequest(task_id=task.task_id, err_message="x" * cap)
                )
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert str(cap) in err.value.details()
            assert tm.summary().tasks_doing == 1 and tm.summary().tasks_done == 0
            stub.report_task_result(
                pb.ReportTaskResultRequest(task_id=task.task_id, exec_counters={"records": 4})
            )
        assert tm.summary().tasks_done == 1
    finally:
        server.stop(0)


def _lease(stub, worker_id, results=(), max_tasks=4, call_id=0, **result):
    req = pb.LeaseTasksRequest(worker_id=worker_id, max_tasks=max_tasks, call_id=call_id)
    for task_id in results:
        req.results.add(task_id=task_id, worker_id=worker_id, **result)
    return list(stub.lease_tasks(req).tasks)


def test_lease_tasks_hands_out_several_and_takes_their_results(master):
    """One call reports a lease's results and hands out the next lease; the epochs' records
    are counted once, the model version travels as with the other calls, and the job ends
    in the evaluation task handed alone, then WAIT / NONE with the model version."""
    tm, _, stub, _ = master
    lease = _lease(stub, 5, call_id=1)
    assert [(t.epoch, t.shard.start) for t in lease] == [(1, 0), (1, 4)]
    lease = _lease(
        stub, 5, [t.task_id for t in lease], call_id=2, exec_counters={"model_version": 9}
    )
    assert [(t.epoch, t.shard.start) for t in lease] == [(2, 0), (2, 4)]
    again = _lease(stub, 5, [1, 2], call_id=2)  # its answer was lost: the same tasks
    assert [t.task_id for t in again] == [t.task_id for t in lease]
    ev = _lease(stub, 5, [t.task_id for t in lease], call_id=3)
    assert [t.type for t in ev] == [pb.EVALUATION]
    s = tm.summary()
    assert s.tasks_done == 4 and s.records_trained == 16
    assert _lease(stub, 5, [ev[0].task_id], max_tasks=0, call_id=4) == []
    (last,) = _lease(stub, 5, call_id=5)
    assert last.task_id == 0 and last.model_version == 9


def test_lease_tasks_refuses_another_workers_results(master):
    tm, _, stub, _ = master
    (t, _) = _lease(stub, 1, max_tasks=2)
    req = pb.LeaseTasksRequest(worker_id=2, max_tasks=1)
    req.results.add(task_id=t.task_id, worker_id=1)
    with pytest.raises(grpc.RpcError) as err:
        stub.lease_tasks(req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "worker_id" in err.value.details() and tm.summary().tasks_done == 0


def test_replicas_report_their_cpu_for_auto_sizing_not_as_task_counters():
    tm = TaskManager(
        TaskManagerConfig(records_per_task=4, num_epochs=1), training_shards=[("train", 0, 8)]
    )
    clock = [100.0]
    reports = CPUReports(clock=lambda: clock[0])
    servicer = MasterServicer(tm, cpu_reports=reports)
    for cpu_ms in (2_000, 5_000):  # cumulative: 3 CPU s over the 10 s between the reports
        task = servicer.get_task(pb.GetTaskRequest(worker_id=1), None)
        req = pb.ReportTaskResultRequest(task_id=task.task_id, worker_id=1)
        req.exec_counters.update({"records": 4, PROCESS_CPU_MS_COUNTER: cpu_ms})
        servicer.report_task_result(req, None)
        servicer.report_ps_load(pb.ReportPSLoadRequest(ps_id=0, cpu_seconds=cpu_ms / 4000), None)
        clock[0] += 10.0
    assert PROCESS_CPU_MS_COUNTER not in tm.summary().exec_counters
    assert tm.summary().records_trained == 8
    assert reports.cores(since=100.0) == {
        "worker-1": pytest.approx(0.3),
        "ps-0": pytest.approx(0.075),
    }
