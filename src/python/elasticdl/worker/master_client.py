"""The worker's view of the master: tasks, task results, evaluation metrics."""
from __future__ import annotations

import logging
from typing import Dict, Mapping, Optional

import grpc
import numpy as np
from elasticdl.common.tensor_utils import ndarray_to_pb
from elasticdl.common.tls import TLS
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc
from elasticdl.worker.grpc_utils import build_channel, call_with_retry
from google.protobuf import empty_pb2  # noqa: F401  (responses are Empty)

logger = logging.getLogger(__name__)

# Result keys that are measurements (floats, sent as task_metrics), not summed counters.
TASK_METRICS = frozenset({"loss"})


class MasterClient:
    """Thin wrapper over `pb_grpc.MasterStub`; every call retries while the master is
    unreachable (starting, or briefly overloaded) for up to `retry_timeout` seconds."""

    def __init__(
        self,
        master_addr: str,
        worker_id: int,
        retry_timeout: float = 120.0,
        rpc_timeout: float = 60.0,
        secret: str | None = None,
        tls_config: TLS | None = None,
    ):
        self.addr = master_addr
        self.worker_id = int(worker_id)
        self.retry_timeout = retry_timeout
        self.rpc_timeout = rpc_timeout
        self._channel = build_channel(master_addr, secret, tls_config)
        self._stub = pb_grpc.MasterStub(self._channel)
        self._combined = True  # False once the master turned out not to have the combined RPC

    def close(self) -> None:
        self._channel.close()

    def _call(self, name: str, request):
        method = getattr(self._stub, name)
        return call_with_retry(
            lambda: method(request, timeout=self.rpc_timeout),
            f"master {self.addr} {name}",
            self.retry_timeout,
        )

    def get_task(self, task_type: int = pb.NONE) -> pb.Task:
        return self._call(
            "get_task", pb.GetTaskRequest(worker_id=self.worker_id, task_type=task_type)
        )

    def report_task_result(
        self,
        task_id: int,
        err_message: str = "",
        exec_counters: Optional[Mapping[str, int]] = None,
        fatal: bool = False,
    ) -> None:
        """``fatal``: no retry can fix ``err_message``; the master fails the job with it."""
        req = self._result_request(task_id, err_message, exec_counters)
        req.fatal = bool(fatal)
        self._call("report_task_result", req)

    def _result_request(
        self, task_id: int, err_message: str, exec_counters: Optional[Mapping[str, int]]
    ) -> pb.ReportTaskResultRequest:
        req = pb.ReportTaskResultRequest(
            task_id=task_id, err_message=err_message, worker_id=self.worker_id
        )
        for k, v in (exec_counters or {}).items():
            if k in TASK_METRICS:
                req.task_metrics[k] = float(v)
            else:
                req.exec_counters[k] = int(v)
        return req

    def report_and_get_task(
        self,
        task_id: int,
        err_message: str = "",
        exec_counters: Optional[Mapping[str, int]] = None,
        task_type: int = pb.NONE,
    ) -> pb.Task:
        """report_task_result(...) then get_task(task_type) in one round trip. Against a
        master without the combined RPC (UNIMPLEMENTED) it makes the two calls instead."""
        if self._combined:
            req = pb.ReportAndGetTaskRequest(
                next=pb.GetTaskRequest(worker_id=self.worker_id, task_type=task_type)
            )
            if task_id:
                req.result.CopyFrom(self._result_request(task_id, err_message, exec_counters))
            try:
                return self._call("report_task_result_and_get_task", req)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                # Nothing was reported: an older master; fall back for the rest of the run.
                logger.info("master %s has no report_task_result_and_get_task", self.addr)
                self._combined = False
        if task_id:
            self.report_task_result(task_id, err_message, exec_counters)
        return self.get_task(task_type)

    def report_evaluation_metrics(
        self, model_outputs: Dict[str, np.ndarray], labels, model_version: int, task_id: int = 0
    ) -> None:
        req = pb.ReportEvaluationMetricsRequest(
            worker_id=self.worker_id, model_version=model_version, task_id=task_id
        )
        for name, value in model_outputs.items():
            ndarray_to_pb(np.asarray(value), req.model_outputs[name])
        ndarray_to_pb(np.asarray(labels), req.labels)
        self._call("report_evaluation_metrics", req)

    def get_job_status(self) -> pb.JobStatus:
        return self._call("get_job_status", pb.JobStatusRequest())
