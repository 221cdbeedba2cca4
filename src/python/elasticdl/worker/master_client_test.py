"""MasterClient against the real master servicer over gRPC on 127.0.0.1."""

import pytest
from elasticdl.master.server import create_master_server
from elasticdl.master.servicer import MasterServicer
from elasticdl.master.task_manager import TaskManager, TaskManagerConfig
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc
from elasticdl.worker.master_client import MasterClient


class _OldMasterServicer(MasterServicer):
    """A master from before report_task_result_and_get_task: the generated base answers
    UNIMPLEMENTED, as an older master binary would."""

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


@pytest.mark.parametrize("servicer_cls", [MasterServicer, _OldMasterServicer])
def test_report_and_get_task_runs_the_job_with_new_and_old_masters(servicer_cls):
    tm = TaskManager(
        TaskManagerConfig(records_per_task=4, num_epochs=2), training_shards=[("t", 0, 12)]
    )
    server, port = create_master_server(
        servicer_cls(tm), 0, bind_host="127.0.0.1", use_asyncio=False, secret=None
    )
    client = MasterClient(f"127.0.0.1:{port}", worker_id=4, retry_timeout=5)
    try:
        assert _drain(client) == [0, 4, 8, 0, 4, 8]
        summary = tm.summary()
        assert summary.tasks_done == 6 and summary.records_trained == 24
        # Against the old master the client fell back to the two calls once, and stays there.
        assert client._combined is (servicer_cls is MasterServicer)
        # The old two calls keep working beside the combined one.
        assert client.get_task().type == pb.NONE
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
    assert dict(req.exec_counters) == {"records": 4} and dict(req.task_metrics) == {"loss": 0.25}
