"""Where the master puts its job's status: ``<job_dir>/status.json``, the platform (a pod
annotation on Kubernetes) and the ``get_job_status`` RPC, all from one
:class:`~elasticdl.common.job_status.JobStatus` snapshot (the type the client reads back)."""

from __future__ import annotations

import bisect
import logging
import threading
import time
from pathlib import Path
from typing import Callable

from elasticdl.common.job_dir import write_atomically
from elasticdl.common.job_status import MAX_LOSS_SAMPLES, JobStatus

logger = logging.getLogger(__name__)


def to_pb(status: JobStatus):
    """-> the ``elasticdl.JobStatus`` message of the ``get_job_status`` RPC."""
    from elasticdl.proto import elasticdl_pb2 as pb

    msg = pb.JobStatus(
        job_name=status.job_name,
        phase=status.phase,
        model_version=status.model_version,
        tasks_done=status.tasks_done,
        tasks_todo=status.tasks_todo,
        tasks_doing=status.tasks_doing,
        tasks_retried=status.tasks_retried,
        records_trained=status.records_trained,
        records_expected=status.records_expected,
        epoch=status.epoch,
        message=status.message,
    )
    for k, v in status.evaluation_metrics.items():
        msg.evaluation_metrics[k] = float(v)
    for r in status.replicas:
        msg.replicas.add(
            type=r.type,
            id=r.id,
            phase=r.phase,
            relaunch_count=r.restarts,
            exit_code=r.exit_code if r.exit_code is not None else 0,
        )
    return msg


class LossHistory:
    """The training loss the workers report with their tasks, for the job status's curve.

    Ordered by model version: workers report concurrently, so a task that ended at version 11
    can be reported before one that ended at 10; each sample is inserted at its version's place
    (after samples of the same version), and the curve reads oldest first whatever the order
    of arrival.

    Bounded: when ``max_samples`` are kept, every second one is dropped and from then on only
    every second report is kept (the stride doubles again at the next fill), so a long job keeps
    an evenly thinned curve from start to end in constant memory."""

    def __init__(self, max_samples: int = MAX_LOSS_SAMPLES) -> None:
        if max_samples < 2:
            raise ValueError(f"max_samples must be at least 2, not {max_samples}")
        self._max = max_samples
        self._samples: list[dict[str, float | int]] = []
        self._stride = 1
        self._seen = 0
        self._lock = threading.Lock()
        self._listeners: list[Callable[[int, float], None]] = []

    def add_listener(self, listener: Callable[[int, float], None]) -> None:
        """Also hand every loss to ``listener(model_version, loss)``, unthinned (e.g. the
        TensorBoard writer)."""
        self._listeners.append(listener)

    def add(self, model_version: int, loss: float) -> None:
        if loss != loss or loss in (float("inf"), float("-inf")):
            return  # JSON has no NaN/inf; a diverged step shows as a gap in the curve
        for listener in self._listeners:
            listener(model_version, loss)
        with self._lock:
            self._seen += 1
            if (self._seen - 1) % self._stride:
                return
            if len(self._samples) >= self._max:
                self._samples = self._samples[::2]
                self._stride *= 2
                if (self._seen - 1) % self._stride:
                    return
            sample = {"model_version": int(model_version), "loss": float(loss)}
            bisect.insort_right(self._samples, sample, key=_model_version)

    def samples(self) -> list[dict[str, float | int]]:
        with self._lock:
            return [dict(s) for s in self._samples]


def _model_version(sample: dict[str, float | int]) -> int:
    return int(sample["model_version"])


class StatusWriter:
    """Rewrites ``status.json`` every ``interval_s`` seconds from ``snapshot()`` (and on demand)."""

    def __init__(
        self,
        path: Path | None,
        snapshot: Callable[[], JobStatus],
        interval_s: float = 2.0,
        publish: Callable[[JobStatus], object] | None = None,
    ) -> None:
        self.path = path
        self._snapshot = snapshot
        self._publish = publish  # e.g. Platform.publish_status (Kubernetes: master pod annotation)
        self._interval = interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def write(self) -> JobStatus:
        status = self._snapshot()
        status.updated_at = time.time()
        if self.path is not None:
            with self._lock:
                try:
                    write_atomically(self.path, status.to_json() + "\n")
                except OSError as e:  # status is best-effort; never kill the job for it
                    logger.warning("Cannot write %s: %s", self.path, e)
        if self._publish is not None:
            try:
                self._publish(status)
            except Exception as e:  # best effort as well
                logger.debug("Cannot publish status: %s", e)
        return status

    def start(self) -> None:
        def loop():
            while not self._stop.wait(self._interval):
                self.write()

        self._thread = threading.Thread(target=loop, name="status-writer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
