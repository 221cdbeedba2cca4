"""Jobs through the server: a submit body in (``elasticdl.jobs.job_request.JobRequest``),
jobs out, run where the server's placement (:mod:`elasticdl.server.placement`) puts them.

Local jobs live in ``<state_dir>/jobs/<user>/<job>/``, the job directories of
:class:`elasticdl.jobs.local_backend.LocalBackend`: that directory is the job's owner record
and its whole state, so a restarted server lists every job, and a job's processes (own
session, started by the backend) go on when the server dies. Jobs on Kubernetes are master
pods labelled with their owner (:mod:`elasticdl.server.k8s_jobs`). The server never imports
or runs the user's model: the master, PS and workers are separate processes.
"""

from __future__ import annotations

import collections
import itertools
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

from elasticdl.common import job_spec
from elasticdl.common.job_status import JobStatus
from elasticdl.common.spec_codec import SpecError
from elasticdl.jobs.backend import JobBackend
from elasticdl.jobs.errors import ClientError, JobConflictError, JobNotFoundError
from elasticdl.jobs.job_request import JobRequest
from elasticdl.jobs.local_job_dir import JOB_FILE
from elasticdl.k8s.names import master_pod_name
from elasticdl.k8s.pod_logs import PodLogs
from elasticdl.server.build_logs import BUILD_REPLICA, BuildLogs
from elasticdl.server.data_store import DataStore
from elasticdl.server.errors import BadRequest, Conflict, NotFound, Unprocessable
from elasticdl.server.image_build_records import BuildRecord, BuildRecords, BuildSettings
from elasticdl.server.image_builds import ImageBuilds
from elasticdl.server.packages import PackageStore
from elasticdl.server.placement import (
    KubernetesPlacement,
    KubernetesTarget,
    LocalPlacement,
    Placement,
)


def job_dict(status: JobStatus, owner: str) -> dict[str, Any]:
    data = status.to_dict()
    data["owner"] = owner
    return data


class JobService:
    def __init__(
        self,
        jobs_dir: Path,
        packages: PackageStore,
        data: DataStore,
        platform: str = "local",
        cancel_grace_seconds: float = 15.0,
        kubernetes: KubernetesTarget | None = None,
        builds: BuildSettings | None = None,
        state_root: Path | None = None,
        pod_logs: PodLogs | None = None,
    ) -> None:
        self.jobs_dir = jobs_dir
        self.packages = packages
        self.data = data
        self.kubernetes = kubernetes or KubernetesTarget()
        self.pod_logs = pod_logs
        self.placement: Placement
        if platform == KubernetesPlacement.platform:
            self.placement = KubernetesPlacement(packages, self.kubernetes, builds, pod_logs)
        else:
            self.placement = LocalPlacement(packages, data, jobs_dir, cancel_grace_seconds)
        self._backends: dict[str, JobBackend] = {}
        self._lock = threading.Lock()  # one submit at a time: job names are checked, then taken
        self._backends_lock = threading.Lock()
        # Kubernetes: package jobs wait for their image (image_builds.py).
        self.build_settings = builds
        self.records = BuildRecords(state_root or jobs_dir.parent)
        self.build_logs = BuildLogs((state_root or jobs_dir.parent) / "build-logs")
        self.builds: ImageBuilds | None = None

    @property
    def platform(self) -> str:
        return self.placement.platform

    def start_builds(self) -> None:
        """Start the thread that drives image builds (a server on Kubernetes with builds)."""
        if not self.placement.builds_images or self.build_settings is None:
            return
        from elasticdl.server.image_builds import write_builder
        from elasticdl.server.k8s_jobs import OWNER_LABEL

        write_builder(self.records.builds.parent)
        k8s = self.backend("").k8s  # the namespace's client; builds are not one user's
        self.builds = ImageBuilds(
            self.build_settings,
            self.records,
            k8s,
            OWNER_LABEL,
            self._submit_built,
            self.build_logs,
            pod_logs=self.pod_logs,
        )
        self.builds.start()

    def _submit_built(self, record: BuildRecord) -> None:
        spec = job_spec.spec_from_values(record.command, record.values)
        spec, _ = spec.resolve()
        try:
            self.backend(record.owner).submit(spec)
        except JobConflictError:
            pass  # submitted before this server restarted

    def backend(self, user: str) -> JobBackend:
        with self._backends_lock:
            backend = self._backends.get(user)
            if backend is None:
                backend = self._backends[user] = self.placement.backend(user)
            return backend

    # ---- submit --------------------------------------------------------------------------
    def submit(self, user: str, request: JobRequest) -> JobStatus:
        if request.command not in job_spec.JOB_COMMANDS:
            raise Unprocessable(
                f"command {request.command!r} is invalid; use one of {', '.join(job_spec.JOB_COMMANDS)}"
            )
        values = self.placement.values(user, request)
        try:
            spec = job_spec.spec_from_values(request.command, values)
            spec, _ = self.placement.place(user, spec).resolve()
            self.placement.check(user, request, spec)
        except SpecError as e:
            raise Unprocessable(self._user_view(user, str(e))) from None
        name = spec.job_name
        with self._lock:
            for other in self._owners(name):
                if other != user:
                    raise Conflict(f"job name {name!r} is taken; choose another job_name")
            if self.records.taken(name):
                raise Conflict(
                    f"job name {name!r} is taken (its image is being built); choose another job_name"
                )
            if self._needs_build(request, values):
                return self._record_build(user, request, values, name)
            try:
                self.backend(user).submit(spec)
            except JobConflictError:
                raise Conflict(self.placement.taken(name)) from None
            except ClientError as e:
                raise Unprocessable(self._user_view(user, str(e))) from None
            self.build_logs.remove(user, name)  # an earlier job's of the same name, if any
        return self.status(user, name)

    def _needs_build(self, request: JobRequest, values: dict[str, Any]) -> bool:
        if not self.placement.builds_images or request.image or not request.package:
            return False
        return not self.records.pushed(values["image_name"])  # else: built before, reused

    def _record_build(
        self, user: str, request: JobRequest, values: dict[str, Any], name: str
    ) -> JobStatus:
        if self.backend(user).k8s.get_pod(master_pod_name(name)) is not None:
            raise Conflict(self.placement.taken(name))
        record = BuildRecord(
            job_name=name,
            owner=user,
            command=request.command,
            values=values,
            package=request.package,
            image=values["image_name"],
            created_at=time.time(),
        )
        self.build_logs.remove(user, name)  # an earlier job's of the same name, if any
        self.records.save(record)
        return record.status(self.kubernetes.namespace)

    def _owners(self, name: str) -> list[str]:
        if not self.jobs_dir.is_dir():
            return []
        return [d.name for d in self.jobs_dir.iterdir() if (d / name / JOB_FILE).is_file()]

    def _user_view(self, user: str, message: str) -> str:
        """A message without the server's directories: paths as the user names them."""
        message = message.replace(str(self.data.user_root(user).resolve()) + "/", "")
        message = message.replace(" on this machine", " in your data directory (upload it first)")
        message = re.sub(
            re.escape(str(self.packages.root)) + r"/[0-9a-f]{64}", "the package", message
        )
        return message.replace(str(self.jobs_dir / user) + "/", "")

    # ---- reading and cancelling ----------------------------------------------------------
    def _call(self, user: str, name: str, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self.backend(user), method)(name, *args, **kwargs)
        except JobNotFoundError as e:
            if "replica" in str(e):
                raise NotFound(self._user_view(user, str(e))) from None
            raise NotFound(f"no job named {name!r}; see GET /v1/jobs") from None
        except ClientError as e:
            raise BadRequest(self._user_view(user, str(e))) from None

    def list(self, user: str) -> list[JobStatus]:
        try:
            jobs = self.backend(user).list_jobs()
        except ClientError as e:
            raise BadRequest(str(e)) from None
        submitted = {job.job_name for job in jobs}
        waiting = [
            r.status(self.kubernetes.namespace)
            for r in self.records.of(user)
            if r.job_name not in submitted
        ]
        return sorted(jobs + waiting, key=lambda s: s.created_at or 0)

    def status(self, user: str, name: str) -> JobStatus:
        record = self.records.get(user, name)
        if record is not None:
            return record.status(self.kubernetes.namespace)
        return self._call(user, name, "status")

    def cancel(self, user: str, name: str) -> JobStatus:
        record = self.records.get(user, name)
        if record is not None and self.builds is not None:
            return self.builds.cancel(record)
        if record is not None:  # a server without builds now: the record is all there is
            self.records.remove(user, name)
            return record.status(self.kubernetes.namespace)
        status = self._call(user, name, "cancel")
        self.build_logs.remove(user, name)  # the job is gone, and the log of its build
        return status

    def logs(
        self, user: str, name: str, replica: str, follow: bool, tail: int = 0
    ) -> Iterator[str]:
        """The log's chunks; the first is read here, so an unknown job or replica raises
        before anything is streamed. ``tail`` > 0: only the log's last ``tail`` lines as they
        are now (what a page showing a log's end polls), not with ``follow``."""
        if tail and follow:
            raise BadRequest("tail: give either tail (the last lines now) or follow, not both")
        record = self.records.get(user, name)
        if record is not None or replica == BUILD_REPLICA:
            chunks = self._build_log(user, name, record, follow)
            return iter([last_lines(chunks, tail)]) if tail else chunks
        chunks = self._call(user, name, "logs", replica, follow=follow)
        try:
            first = next(chunks, "")
        except JobNotFoundError as e:
            raise NotFound(self._user_view(user, str(e))) from None
        chunks = itertools.chain([first], chunks)
        return iter([last_lines(chunks, tail)]) if tail else chunks

    def _build_log(
        self, user: str, name: str, record: BuildRecord | None, follow: bool
    ) -> Iterator[str]:
        """The image build's log (``replica=build``; any replica until the job runs)."""
        if record is not None and self.builds is not None:
            if follow and record.phase != "failed":
                return self.builds.follow(record)
            return iter([self.builds.logs(record)])
        if record is not None:  # a server without builds now: the record is all there is
            return iter([self.build_logs.read(user, name) or record.message + "\n"])
        self._call(user, name, "status")  # an unknown job is not found
        kept = self.build_logs.read(user, name)
        if kept is None:
            raise NotFound(
                f"job {name!r} has no image build log (it runs a given image, or one built "
                "for an earlier job); see replica=master"
            )
        return iter([kept])


def last_lines(chunks: Iterable[str], count: int) -> str:
    """The last COUNT lines of the text the chunks make up, read in one pass (a line's end
    kept as it was; a last line without one counts)."""
    lines: collections.deque[str] = collections.deque(maxlen=count + 1)
    partial = ""
    for chunk in chunks:
        pieces = (partial + chunk).split("\n")
        partial = pieces.pop()
        lines.extend(piece + "\n" for piece in pieces)
    if partial:
        lines.append(partial)
    return "".join(list(lines)[-count:])
