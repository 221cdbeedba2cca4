"""The job's status as the master sees it: ``<job_dir>/status.json`` and the ``get_job_status``
RPC are both built from one snapshot (see ``elasticdl.client.job_status`` for the reader)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

logger = logging.getLogger(__name__)

PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLED = (
    "Pending",
    "Running",
    "Succeeded",
    "Failed",
    "Cancelled",
)
FINAL_PHASES = (SUCCEEDED, FAILED, CANCELLED)


def write_json_atomically(path: Path, data: dict) -> None:
    """Readers never see a half-written file: write a temp file, then rename over."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    os.replace(tmp, path)


def to_pb(status: dict):
    """Snapshot dict -> ``elasticdl.JobStatus`` message."""
    from elasticdl.proto import elasticdl_pb2 as pb

    msg = pb.JobStatus(
        job_name=status.get("job_name", ""),
        phase=status.get("phase", ""),
        model_version=int(status.get("model_version", 0)),
        tasks_done=int(status.get("tasks_done", 0)),
        tasks_todo=int(status.get("tasks_todo", 0)),
        tasks_doing=int(status.get("tasks_doing", 0)),
        tasks_retried=int(status.get("tasks_retried", 0)),
        records_trained=int(status.get("records_trained", 0)),
        records_expected=int(status.get("records_expected", 0)),
        epoch=int(status.get("epoch", 0)),
        message=status.get("message", ""),
    )
    for k, v in (status.get("evaluation_metrics") or {}).items():
        msg.evaluation_metrics[k] = float(v)
    for r in status.get("replicas", []):
        msg.replicas.add(
            type=r.get("type", ""),
            id=int(r.get("id", 0)),
            phase=r.get("phase", ""),
            relaunch_count=int(r.get("restarts", 0)),
            exit_code=int(r["exit_code"]) if r.get("exit_code") is not None else 0,
        )
    return msg


class StatusWriter:
    """Rewrites ``status.json`` every ``interval_s`` seconds from ``snapshot()`` (and on demand)."""

    def __init__(
        self,
        path: Path | None,
        snapshot: Callable[[], dict],
        interval_s: float = 2.0,
        publish: Callable[[dict], object] | None = None,
    ) -> None:
        self.path = path
        self._snapshot = snapshot
        self._publish = publish  # e.g. Platform.publish_status (Kubernetes: master pod annotation)
        self._interval = interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def write(self) -> dict:
        status = self._snapshot()
        status["updated_at"] = time.time()
        if self.path is not None:
            with self._lock:
                try:
                    write_json_atomically(self.path, status)
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
