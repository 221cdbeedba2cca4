"""The worker's view of the master: tasks, task results, evaluation metrics.

Task leases (``lease_tasks``, see ``master.task_leases``): the client asks for up to
``lease_tasks`` tasks at a time and hands them to the worker one by one; the results of
successful tasks wait and travel with the next lease call, so the master's per-call cost is
paid once per lease. A failure, a result sent with ``report_task_result`` (the worker's
"send it now") and ``flush_results`` send every waiting result at once. The master keeps
leases small near the end of the data (down to one task), so a worker does not sit on tasks
others could run. Against a master without ``lease_tasks`` the client falls back to
``report_task_result_and_get_task``, and against one without that to the two calls.
"""
from __future__ import annotations

import collections
import logging
import random
import threading
import time
from typing import Dict, List, Mapping, Optional

import grpc
import numpy as np
from elasticdl.common.process_cpu import PROCESS_CPU_MS_COUNTER, own_cpu_seconds
from elasticdl.common.tensor_utils import ndarray_to_pb
from elasticdl.common.tls import TLS
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc
from elasticdl.worker.grpc_utils import build_channel, call_with_retry
from google.protobuf import empty_pb2  # noqa: F401  (responses are Empty)

logger = logging.getLogger(__name__)

# Result keys that are measurements (floats, sent as task_metrics), not summed counters.
TASK_METRICS = frozenset({"loss"})

# Tasks a worker asks for per call. The master's cost per call (~300 us of CPU, most of it
# gRPC's) is then spread over 4 tasks, which is most of the gain (the rest of its cost is per
# task), while a worker that dies has at most 4 tasks to re-queue and 3 results to run again.
DEFAULT_LEASE_TASKS = 4
# Seconds of an unreachable master after which a call goes on over a new channel.
REBUILD_CHANNEL_AFTER_S = 10.0


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
        lease_tasks: int = DEFAULT_LEASE_TASKS,
    ):
        """``lease_tasks``: tasks asked for per call (0: no leases, one task per call)."""
        self.addr = master_addr
        self.worker_id = int(worker_id)
        self.retry_timeout = retry_timeout
        self.rpc_timeout = rpc_timeout
        self._secret, self._tls_config = secret, tls_config
        self._channel = build_channel(master_addr, secret, tls_config)
        self._stub = pb_grpc.MasterStub(self._channel)
        self._channel_lock = threading.Lock()
        self._channel_built = time.monotonic()
        # Replaced channels and when: each is closed once no call can still be on it.
        self._old_channels: list[tuple[float, grpc.Channel]] = []
        self._combined = True  # False once the master turned out not to have the combined RPC
        self.lease_tasks = max(0, int(lease_tasks))
        # The worker's look-ahead thread and its loop both call in: one call at a time.
        self._lease_lock = threading.Lock()
        self._leased: collections.deque[pb.Task] = collections.deque()  # not handed on yet
        self._results: List[pb.ReportTaskResultRequest] = []  # finished, not sent yet
        self._outstanding: set[int] = set()  # handed to the worker (or queued), not reported
        # Numbers this client's lease calls; a retry of one keeps its number. A random start,
        # so a restarted worker with the same id does not repeat its predecessor's numbers.
        self._call_id = random.getrandbits(48)

    def close(self) -> None:
        for _, channel in self._old_channels:
            channel.close()
        self._channel.close()

    def _call(self, name: str, request):
        return call_with_retry(
            lambda: getattr(self._stub, name)(request, timeout=self.rpc_timeout),
            f"master {self.addr} {name}",
            self.retry_timeout,
            self._rebuild_channel_if_stuck,
        )

    def _rebuild_channel_if_stuck(self, unavailable_s: float) -> None:
        """A new channel once the master has been unreachable for REBUILD_CHANNEL_AFTER_S
        (and at most that often): a channel that resolved the master's name to the address of
        a master that died can go on trying that address after its successor is up, where a
        new channel resolves the name afresh. The old channel stays open for calls still on
        it: every call ends within ``rpc_timeout``, so a channel replaced longer ago than that
        is closed here (closing one with a call on it would fail the call, not retry it), which
        bounds the open channels through any outage to about rpc_timeout /
        REBUILD_CHANNEL_AFTER_S."""
        with self._channel_lock:
            now = time.monotonic()
            if unavailable_s < REBUILD_CHANNEL_AFTER_S:
                return
            if now - self._channel_built < REBUILD_CHANNEL_AFTER_S:
                return
            logger.info("master %s unreachable for %.0f s: a new channel", self.addr, unavailable_s)
            self._close_channels_replaced_before(now - self.rpc_timeout - 1.0)
            self._old_channels.append((now, self._channel))
            self._channel = build_channel(self.addr, self._secret, self._tls_config)
            self._stub = pb_grpc.MasterStub(self._channel)
            self._channel_built = now

    def _close_channels_replaced_before(self, moment: float) -> None:
        keep = []
        for replaced, channel in self._old_channels:
            if replaced < moment:
                channel.close()
            else:
                keep.append((replaced, channel))
        self._old_channels = keep

    @property
    def leasing(self) -> bool:
        """Whether tasks come in leases (False: off, or the master has no lease_tasks)."""
        return self.lease_tasks > 0

    def get_task(self, task_type: int = pb.NONE) -> pb.Task:
        if self.leasing:
            with self._lease_lock:
                if self.leasing:
                    return self._next_leased_locked(task_type)
        return self._call(
            "get_task", pb.GetTaskRequest(worker_id=self.worker_id, task_type=task_type)
        )

    # ---- leases ----------------------------------------------------------------------------
    def _next_leased_locked(self, task_type: int) -> pb.Task:
        """The next task of the lease, or a new lease (with the waiting results)."""
        for _ in range(3):
            if self._leased:
                return self._leased.popleft()
            task = self._lease_locked(task_type, self.lease_tasks)
            if task is not None:
                return task
        # Only tasks this worker already has came back, three times: let it finish them.
        return pb.Task(type=pb.WAIT)

    def _lease_locked(self, task_type: int, max_tasks: int) -> Optional[pb.Task]:
        """One lease call: send the waiting results, queue the new tasks; returns the first
        (None: all of them are tasks this worker already has, e.g. taken back past the task
        timeout while queued here, then leased to it again)."""
        self._call_id += 1
        req = pb.LeaseTasksRequest(
            worker_id=self.worker_id,
            max_tasks=max_tasks,
            task_type=task_type,
            call_id=self._call_id,
        )
        req.results.extend(self._results)
        try:
            lease = self._call("lease_tasks", req)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            # Nothing was reported: an older master; fall back for the rest of the run.
            logger.info("master %s has no lease_tasks: one task per call", self.addr)
            self.lease_tasks = 0
            results, self._results = self._results, []
            for r in results:
                self._call("report_task_result", r)
            if not max_tasks:
                return None
            return self._call(
                "get_task", pb.GetTaskRequest(worker_id=self.worker_id, task_type=task_type)
            )
        self._results = []
        if max_tasks == 0:
            return None
        tasks = list(lease.tasks)
        if len(tasks) == 1 and tasks[0].task_id == 0:
            return tasks[0]  # WAIT or NONE
        fresh = [t for t in tasks if t.task_id not in self._outstanding]
        self._outstanding.update(t.task_id for t in fresh)
        self._leased.extend(fresh)
        return self._leased.popleft() if self._leased else None

    def _add_result_locked(
        self, task_id: int, err_message: str, exec_counters, fatal: bool = False
    ) -> None:
        req = self._result_request(task_id, err_message, exec_counters)
        req.fatal = bool(fatal)
        self._results.append(req)
        self._outstanding.discard(task_id)

    def flush_results(self) -> None:
        """Send the results waiting for the next lease now (nothing is asked for)."""
        if not self.leasing:
            return
        with self._lease_lock:
            if self._results:
                self._lease_locked(pb.NONE, 0)

    def leased_task_ids(self) -> list[int]:
        """Tasks leased to this worker that it has not been handed yet."""
        with self._lease_lock:
            return [t.task_id for t in self._leased]

    def report_task_result(
        self,
        task_id: int,
        err_message: str = "",
        exec_counters: Optional[Mapping[str, int]] = None,
        fatal: bool = False,
    ) -> None:
        """``fatal``: no retry can fix ``err_message``; the master fails the job with it.
        With leases, every result still waiting goes with it, now."""
        if self.leasing:
            with self._lease_lock:
                if self.leasing:
                    self._add_result_locked(task_id, err_message, exec_counters, fatal)
                    self._lease_locked(pb.NONE, 0)
                    return
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
        # What this worker costs, for --num_workers=auto (elasticdl.common.process_cpu).
        req.exec_counters[PROCESS_CPU_MS_COUNTER] = int(own_cpu_seconds() * 1000)
        return req

    def report_and_get_task(
        self,
        task_id: int,
        err_message: str = "",
        exec_counters: Optional[Mapping[str, int]] = None,
        task_type: int = pb.NONE,
    ) -> pb.Task:
        """report_task_result(...) then get_task(task_type) in one round trip. With leases the
        result waits for the next lease call (a failure goes at once) and the task is the
        lease's next. Against a master without the combined RPC (UNIMPLEMENTED) it makes the
        two calls instead."""
        if self.leasing:
            with self._lease_lock:
                if self.leasing:
                    if task_id:
                        self._add_result_locked(task_id, err_message, exec_counters)
                        if err_message and self._leased:
                            self._lease_locked(pb.NONE, 0)  # so another worker retries it
                    return self._next_leased_locked(task_type)
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
