"""In-cluster image builds: a package job on Kubernetes waits for its image, built by a pod.

``POST /v1/jobs`` with a package (and no image) on a server with builds configured: the spec
is checked as for any job, then the job is recorded (phase ``building``,
:mod:`elasticdl.server.image_build_records`) and :meth:`ImageBuilds.reconcile` (a server
thread) drives it:

1. the image's name comes from the package id and the base image
   (:meth:`BuildSettings.image_for`); an image this server pushed before is used as it is;
2. otherwise the build pod ``elasticdl-<job>-build`` (:mod:`elasticdl.k8s.image_build_pod`)
   makes it from the package, with the build program copied to ``<state_dir>/builder/``;
3. the pod Succeeded: its log is kept (``build_logs``), the job is submitted with the new
   image (its master pod, as any job), the record and the build pod go. Failed: its log is
   kept and the record turns ``failed`` with the log's last lines, which the job's status
   shows.

The logs API's ``replica=build`` follows the build pod's log while it runs, then serves the
kept log (:meth:`ImageBuilds.follow`). Everything is in the records and in Kubernetes
objects, so a restarted server resumes every build where it was (a master pod that already
exists means the job was submitted). Cancel deletes the build pod and the record.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from elasticdl.common.job_dir import write_atomically
from elasticdl.common.job_status import JobStatus
from elasticdl.common.types import JobPhase
from elasticdl.k8s.image_build_pod import BUILDER_FILE, CONTAINERS, build_pod_name, image_build_pod
from elasticdl.k8s.pod_logs import ApiPodLogs, PodLogs
from elasticdl.server.build_logs import BuildLogs
from elasticdl.server.image_build_records import (
    BUILDING,
    FAILED,
    BuildRecord,
    BuildRecords,
    BuildSettings,
)

logger = logging.getLogger(__name__)

LOG_LINES = 20  # of a failed build's log, kept in its record and shown in the job's status


def write_builder(root: Path) -> Path:
    """The build pods' program (a copy of ``elasticdl.images.oci_build``, standard library
    only) in ``<state_dir>/builder/``, readable by their non-root user."""
    from elasticdl.images import oci_build

    directory = root / "builder"
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    path = directory / BUILDER_FILE
    write_atomically(path, inspect.getsource(oci_build), mode=0o644)
    return path


def build_pod(
    settings: BuildSettings, record: BuildRecord, namespace: str, owner_label: str
) -> dict[str, Any]:
    """The build pod's manifest of ``record``, labelled with its owner."""
    return image_build_pod(record.build(settings), namespace, {owner_label: record.owner})


class ImageBuilds:
    """Drives the build records (see the module docstring). ``submit(record)`` submits the
    job with its image; it raises what the job service raises (a job that exists already is
    success: a previous server submitted it)."""

    def __init__(
        self,
        settings: BuildSettings,
        records: BuildRecords,
        k8s,  # elasticdl.k8s.client.K8sClient of the jobs' namespace
        owner_label: str,
        submit: Callable[[BuildRecord], None],
        build_logs: BuildLogs,
        interval: float = 1.0,
        pod_logs: PodLogs | None = None,
    ) -> None:
        self.settings = settings
        self.records = records
        self.build_logs = build_logs
        self.k8s = k8s
        self.owner_label = owner_label
        self.submit = submit
        self.interval = interval
        self.pod_logs = pod_logs or ApiPodLogs()
        self._lock = threading.Lock()  # one reconcile at a time (thread and cancel)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="image-builds", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.reconcile()
            except Exception:  # a broken API call must not end the builds for good
                logger.exception("image builds: reconcile failed; retrying")

    def reconcile(self) -> None:
        with self._lock:
            for record in self.records.all():
                if record.phase == BUILDING:
                    self._step(record)

    def _step(self, record: BuildRecord) -> None:
        name = build_pod_name(record.job_name)
        if self.records.pushed(record.image):
            self._submit(record)
            return
        pod = self.k8s.get_pod(name)
        if pod is None:
            logger.info("image builds: %s builds %s", name, record.image)
            self.k8s.core.create_namespaced_pod(
                self.k8s.namespace,
                build_pod(self.settings, record, self.k8s.namespace, self.owner_label),
            )
            return
        phase = pod.status.phase if pod.status else None
        if phase == "Succeeded":
            self._keep_log(record)
            self.records.mark_pushed(record.image)
            self._submit(record)
        elif phase == "Failed":
            text = self._keep_log(record)
            # The pod goes before the record says Failed: a failed delete leaves the record
            # building, so the next pass deletes again instead of leaking the pod.
            self.k8s.delete_pod(name, grace_seconds=0)
            record.phase = FAILED
            record.message = f"image build failed: {self._log_tail(text, pod)}"
            self.records.save(record)
        else:
            message = f"building image {record.image} (build pod {name}: {phase or 'Pending'})"
            if message != record.message:
                record.message = message
                self.records.save(record)

    def _submit(self, record: BuildRecord) -> None:
        try:
            self.submit(record)
        except Exception as e:  # the spec was checked at POST; what is left is the cluster's
            record.phase = FAILED
            record.message = f"cannot submit the job with image {record.image}: {e}"
            self.records.save(record)
            return
        # As above: the pod goes first; a repeated submit finds the job there (success).
        self.k8s.delete_pod(build_pod_name(record.job_name), grace_seconds=0)
        self.records.remove(record.owner, record.job_name)

    def _read_log(self, record: BuildRecord) -> str:
        """The build pod's whole log as it is now: its containers' logs one after the other."""
        return self.pod_logs.read(self.k8s, build_pod_name(record.job_name), CONTAINERS) or ""

    def _keep_log(self, record: BuildRecord) -> str:
        """Keep the ended build pod's log (before the pod goes); answers it."""
        text = self._read_log(record)
        self.build_logs.keep(record.owner, record.job_name, text)
        return text

    def _log_tail(self, text: str, pod) -> str:
        reason = pod.status.reason or ""
        lines = [ln for ln in text.splitlines() if ln.strip()]
        tail = " | ".join(lines[-LOG_LINES:])
        if reason:  # e.g. DeadlineExceeded: the build ran past its time
            tail = f"{reason} {pod.status.message or ''}".strip() + (f": {tail}" if tail else "")
        return tail or "the build pod failed without a log"

    def cancel(self, record: BuildRecord) -> JobStatus:
        with self._lock:
            self.k8s.delete_pod(build_pod_name(record.job_name), grace_seconds=0)
            self.records.remove(record.owner, record.job_name)
            self.build_logs.remove(record.owner, record.job_name)  # the job is gone
        status = record.status(self.k8s.namespace)
        status.phase = JobPhase.CANCELLED
        status.message = "cancelled while its image was being built"
        return status

    def logs(self, record: BuildRecord) -> str:
        """A build's log as it is now: the pod's while it runs, else the kept one."""
        if record.phase == BUILDING:
            text = self._read_log(record)
            if text:
                return text
        kept = self.build_logs.read(record.owner, record.job_name)
        if kept:
            return kept
        if record.phase == FAILED:
            return record.message + "\n"
        return f"{record.status(self.k8s.namespace).message}\n"

    def follow(self, record: BuildRecord, poll: float = 0.3) -> Iterator[str]:
        """The build pod's log as it is written, until the pod ends; then the rest of the
        log this server kept (what was written after the last read, if anything)."""
        seen: list[str] = []
        for chunk in self._follow_pod(record, poll):
            seen.append(chunk)
            yield chunk
        # The reconcile thread keeps the log, then drops the record (or marks it failed).
        while self._building(record):
            time.sleep(poll)
        streamed = "".join(seen)
        kept = self.build_logs.read(record.owner, record.job_name)
        if kept is None:
            if not streamed:
                yield self.logs(self.records.get(record.owner, record.job_name) or record)
        elif kept.startswith(streamed):
            rest = kept[len(streamed) :]
            if rest:
                yield rest

    def _building(self, record: BuildRecord) -> bool:
        current = self.records.get(record.owner, record.job_name)
        return current is not None and current.phase == BUILDING

    def _pod(self, name: str):
        try:
            return self.k8s.get_pod(name)
        except Exception:  # the API server away for a moment: as if the pod were not seen yet
            return None

    def _follow_pod(self, record: BuildRecord, poll: float) -> Iterator[str]:
        name = build_pod_name(record.job_name)
        # The reconcile thread creates the pod: until then there is no log to follow.
        while self._pod(name) is None:
            if not self._building(record):
                return
            time.sleep(poll)
        try:
            yield from self.pod_logs.follow(
                self.k8s, name, CONTAINERS, active=lambda: self._building(record)
            )
        except Exception as e:  # the pod was deleted under the stream
            logger.info("image builds: stopped following %s: %s", name, e)
