"""The master's gRPC service (`elasticdl.Master`): a thin adapter over the task manager, the
evaluation service and the job status. No logic lives here beyond translating messages."""

from __future__ import annotations

import logging
from typing import Callable

import grpc
from elasticdl.common.process_cpu import PROCESS_CPU_MS_COUNTER
from elasticdl.common.tensor_utils import pb_to_ndarray
from elasticdl.master import ps_rescale
from elasticdl.master.autoscaler import PSLoads
from elasticdl.master.evaluation_service import EvaluationMetricsError, EvaluationService
from elasticdl.master.job_cpu import CPUReports
from elasticdl.master.ps_rescale import PSRescaler, RescaleRefused
from elasticdl.master.rendezvous import Rendezvous
from elasticdl.master.status_writer import LossHistory
from elasticdl.master.task_manager import TaskManager
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc
from google.protobuf import empty_pb2

logger = logging.getLogger(__name__)

# exec_counters key of ReportTaskResultRequest: the newest PS model version the worker saw.
MODEL_VERSION_COUNTER = "model_version"
# task_metrics key of ReportTaskResultRequest: a training task's mean loss.
LOSS_METRIC = "loss"

_NO_RENDEZVOUS = (
    "this job runs ParameterServerStrategy; get_comm_rank and report_training_loop_status serve "
    "AllreduceStrategy jobs only (--distribution_strategy=AllreduceStrategy)"
)


class MasterServicer(pb_grpc.MasterServicer):
    def __init__(
        self,
        task_manager: TaskManager,
        evaluation_service: EvaluationService | None = None,
        job_status: Callable[[], pb.JobStatus] | None = None,
        rendezvous: Rendezvous | None = None,
        loss_history: LossHistory | None = None,
        ps_loads: PSLoads | None = None,
        ps_rescaler: PSRescaler | None = None,
        cpu_reports: CPUReports | None = None,
    ) -> None:
        self._tm = task_manager
        self._cpu_reports = cpu_reports  # the replicas' own CPU seconds, for auto sizing
        self._rescaler = ps_rescaler  # ParameterServerStrategy training jobs
        self._ps_loads = ps_loads
        self._loss_history = loss_history
        self._es = evaluation_service
        self._job_status = job_status
        self._rendezvous = rendezvous  # AllreduceStrategy jobs only
        self._model_version = 0  # latest version reported by any PS (workers': the task manager)

    @property
    def model_version(self) -> int:
        seen = max(self._model_version, self._tm.model_version_seen)
        if self._es is not None:
            return max(seen, self._es.model_version)
        return seen

    def get_task(self, request: pb.GetTaskRequest, context) -> pb.Task:
        task = self._tm.get(request.worker_id)
        if task.task_id == 0:
            # No task: tell the worker how far the model is (the original did the same).
            return task.to_pb(model_version=self.model_version)
        return self._stamped(task.to_pb())

    def _stamped(self, task: pb.Task) -> pb.Task:
        """A task handed out, with the PS set to train it through (see master.ps_rescale)."""
        return self._rescaler.stamp(task) if self._rescaler is not None else task

    def report_task_result(self, request: pb.ReportTaskResultRequest, context):
        if request.fatal and request.err_message:
            # Every retry would fail the same way (e.g. a PS refused the model's tables).
            self._tm.fail(f"worker {request.worker_id}: {request.err_message}")
        self._tm.report(**self._report_args(request))
        # A stale report is not an error for the worker: the work is simply accounted elsewhere.
        return empty_pb2.Empty()

    def _report_args(self, request: pb.ReportTaskResultRequest) -> dict:
        """The task manager's report arguments; notes the loss for the job status on the way."""
        counters = dict(request.exec_counters)
        # Workers tell the PS version they trained against, so the job status shows progress
        # between evaluations (the PS reports versions only at --evaluation_steps).
        version = counters.pop(MODEL_VERSION_COUNTER, None)
        cpu_ms = counters.pop(PROCESS_CPU_MS_COUNTER, None)  # not a task's counter
        if cpu_ms is not None and self._cpu_reports is not None:
            self._cpu_reports.update(f"worker-{request.worker_id}", cpu_ms / 1000.0)
        loss = request.task_metrics.get(LOSS_METRIC)
        if loss is not None and self._loss_history is not None and not request.err_message:
            self._loss_history.add(version if version is not None else self.model_version, loss)
        return dict(
            task_id=request.task_id,
            success=not request.err_message,
            worker_id=request.worker_id,
            exec_counters=counters,
            err_message=request.err_message,
            model_version=version,
        )

    def report_task_result_and_get_task(self, request: pb.ReportAndGetTaskRequest, context):
        """report_task_result(result), then get_task(next): one round trip per task instead
        of two. No result (or task_id 0) means nothing to report, e.g. the worker's first call."""
        if request.HasField("result") and request.result.task_id != 0:
            if request.result.worker_id != request.next.worker_id:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"result.worker_id {request.result.worker_id} != next.worker_id "
                    f"{request.next.worker_id}: report and ask for the same worker",
                )
            # One exchange: a repeated call whose answer was lost gets the same task again.
            task = self._tm.report_and_get(**self._report_args(request.result))
            if task.task_id != 0:
                return self._stamped(task.to_pb())
            return task.to_pb(model_version=self.model_version)
        return self.get_task(request.next, context)

    def lease_tasks(self, request: pb.LeaseTasksRequest, context) -> pb.TaskLease:
        """Report ``results`` and hand out up to ``max_tasks`` tasks in one call (a lease, see
        ``master.task_leases``); a repeated call whose answer was lost gets the same tasks."""
        results = []
        for r in request.results:
            if r.worker_id != request.worker_id:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"results[].worker_id {r.worker_id} != worker_id {request.worker_id}: "
                    "report only this worker's tasks",
                )
            if r.fatal and r.err_message:
                self._tm.fail(f"worker {r.worker_id}: {r.err_message}")
            args = self._report_args(r)
            del args["worker_id"]
            results.append(args)
        tasks = self._tm.lease(request.worker_id, results, request.max_tasks, request.call_id)
        lease = pb.TaskLease()
        for task in tasks:
            if task.task_id == 0:
                lease.tasks.append(task.to_pb(model_version=self.model_version))
            else:
                lease.tasks.append(self._stamped(task.to_pb()))
        return lease

    def report_evaluation_metrics(self, request: pb.ReportEvaluationMetricsRequest, context):
        if self._es is None:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this job has no evaluation (no --validation_data); evaluation metrics are not accepted",
            )
        try:
            outputs = {k: pb_to_ndarray(v) for k, v in request.model_outputs.items()}
            self._es.report_evaluation_metrics(
                outputs,
                pb_to_ndarray(request.labels),
                worker_id=request.worker_id,
                task_id=request.task_id,
                model_version=request.model_version,
            )
        except (EvaluationMetricsError, ValueError) as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return empty_pb2.Empty()

    def report_version(self, request: pb.ReportVersionRequest, context):
        self._model_version = max(self._model_version, request.model_version)
        if self._es is not None:
            self._es.report_version(request.model_version)
        return empty_pb2.Empty()

    def report_ps_load(self, request: pb.ReportPSLoadRequest, context):
        if self._ps_loads is not None:
            self._ps_loads.update(
                request.ps_id,
                {
                    "window_s": request.window_seconds,
                    "cpu_fraction": request.cpu_fraction,
                    "lock_busy_fraction": request.lock_busy_fraction,
                    "lock_wait_ms": request.lock_wait_ms,
                    "requests": request.requests,
                },
            )
        if self._cpu_reports is not None and request.cpu_seconds > 0:
            self._cpu_reports.update(f"ps-{request.ps_id}", request.cpu_seconds)
        return empty_pb2.Empty()

    def get_comm_rank(self, request: pb.GetCommRankRequest, context) -> pb.GetCommRankResponse:
        if self._rendezvous is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, _NO_RENDEZVOUS)
        c = self._rendezvous.get_comm_rank(request.worker_id)
        return pb.GetCommRankResponse(
            rank_id=c.rank,
            world_size=c.world_size,
            rendezvous_id=c.rendezvous_id,
            rendezvous_addr=c.store_host,
            rendezvous_port=c.store_port,
            members_gone=c.members_gone,
        )

    def report_training_loop_status(self, request: pb.ReportTrainingLoopStatusRequest, context):
        if self._rendezvous is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, _NO_RENDEZVOUS)
        if request.status == pb.LOOP_START:
            if request.rendezvous_id > 0:
                self._rendezvous.acknowledge(request.worker_id, request.rendezvous_id)
            else:
                self._rendezvous.join(request.worker_id, request.worker_host)
        elif request.status == pb.LOOP_END:
            self._rendezvous.leave(request.worker_id, reason="training loop ended")
        else:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"unknown training loop status {request.status}"
            )
        return empty_pb2.Empty()

    def report_training_params(self, request, context):
        context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "report_training_params (custom training loops) is not implemented; the master "
            "creates shards from --training_data",
        )

    def scale_ps(self, request: pb.ScalePSRequest, context) -> pb.ScalePSResponse:
        try:
            change = ps_rescale.ask(self._rescaler, request.num_ps)
        except RescaleRefused as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return pb.ScalePSResponse(generation=change.generation, message=change.accepted_message)

    def get_job_status(self, request, context) -> pb.JobStatus:
        if self._job_status is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "job status is not available yet")
        return self._job_status()
