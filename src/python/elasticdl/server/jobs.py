"""Jobs through the server: the typed job spec in, local jobs (processes) out.

Each user's jobs live in ``<state_dir>/jobs/<user>/<job>/``, the job directories of
``elasticdl.client.local_backend.LocalBackend``: that directory is the job's owner record and
its whole state, so a restarted server lists every job, and a job's processes (own session,
started by the backend) go on when the server dies. The server never imports or runs the
user's model: the master, PS and workers are separate processes.

What the server decides, not the user: where the model zoo is (the uploaded package), where
the job directory is, and the platform. Data and output paths in the spec are paths in the
user's data directory (``--training_data=mnist/train``) and cannot leave it.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import threading
from pathlib import Path
from typing import Any, Iterator

from elasticdl.client.errors import ClientError, JobConflictError, JobNotFoundError
from elasticdl.client.local_backend import JOB_FILE, LocalBackend
from elasticdl.common import job_spec
from elasticdl.common.job_status import JobStatus
from elasticdl.common.spec_codec import SpecError
from elasticdl.server.data_store import DataStore
from elasticdl.server.errors import BadRequest, Conflict, NotFound, Unprocessable
from elasticdl.server.packages import PackageStore

# Spec fields that are paths in the user's data directory.
DATA_PATH_FIELDS = (
    "training_data",
    "validation_data",
    "prediction_data",
    "checkpoint_dir_for_init",
    "checkpoint_dir",
    "output",
    "log_file_path",
)
# Spec fields the server sets itself.
SERVER_FIELDS = {
    "model_zoo": "the model zoo is the uploaded package; give 'package' instead",
    "job_dir": "the server keeps job directories itself",
    "cluster_spec": "a file on the server; use cluster_spec_json",
}


@dataclasses.dataclass(frozen=True)
class SubmitRequest:
    command: str
    spec: dict[str, Any]
    package: str = ""
    image: str = ""


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
    ) -> None:
        self.jobs_dir = jobs_dir
        self.packages = packages
        self.data = data
        self.platform = platform
        self.cancel_grace_seconds = cancel_grace_seconds
        self._backends: dict[str, LocalBackend] = {}
        self._lock = threading.Lock()  # one submit at a time: job names are checked, then taken
        self._backends_lock = threading.Lock()

    def backend(self, user: str) -> LocalBackend:
        with self._backends_lock:
            backend = self._backends.get(user)
            if backend is None:
                backend = LocalBackend(
                    root=self.jobs_dir / user, cancel_grace_seconds=self.cancel_grace_seconds
                )
                self._backends[user] = backend
            return backend

    # ---- submit --------------------------------------------------------------------------
    def _values(self, user: str, request: SubmitRequest) -> dict[str, Any]:
        if request.command not in job_spec.JOB_COMMANDS:
            raise Unprocessable(
                f"command {request.command!r} is invalid; use one of {', '.join(job_spec.JOB_COMMANDS)}"
            )
        if request.image and not request.package:
            raise Unprocessable(
                "image: this server runs local jobs from packages; upload the model zoo "
                "(POST /v1/packages) and give 'package'"
            )
        if not request.package:
            raise Unprocessable(
                "package is required: upload the model zoo with POST /v1/packages first"
            )
        try:
            zoo = self.packages.path(request.package)
        except NotFound as e:
            raise Unprocessable(f"package: {e.reason}") from None
        values = dict(request.spec)
        for name, why in SERVER_FIELDS.items():
            if name in values:
                raise Unprocessable(f"spec.{name} cannot be set: {why}")
        platform = values.pop("platform", None)
        if platform not in (None, self.platform):
            raise Unprocessable(
                f"spec.platform {platform!r}: this server runs {self.platform} jobs; drop the field"
            )
        for name in DATA_PATH_FIELDS:
            value = values.get(name)
            if value in (None, ""):
                continue
            if not isinstance(value, str):
                raise Unprocessable(f"spec.{name} must be a string, got {type(value).__name__}")
            try:
                values[name] = str(self.data.resolve(user, value, what=f"spec.{name}"))
            except BadRequest as e:
                raise Unprocessable(e.reason) from None
        values["model_zoo"] = str(zoo)
        values["platform"] = self.platform
        return values

    def submit(self, user: str, request: SubmitRequest) -> JobStatus:
        values = self._values(user, request)
        try:
            spec = job_spec.spec_from_values(request.command, values)
            spec = spec.replace(job_dir=str(self.jobs_dir / user / spec.job_name))
            spec, _ = spec.resolve()
        except SpecError as e:
            raise Unprocessable(self._user_view(user, str(e))) from None
        name = spec.job_name
        with self._lock:
            for other in self._owners(name):
                if other != user:
                    raise Conflict(f"job name {name!r} is taken; choose another job_name")
            try:
                self.backend(user).submit(spec)
            except JobConflictError:
                raise Conflict(
                    f"job {name!r} is still running; cancel it (DELETE /v1/jobs/{name}) or "
                    "choose another job_name"
                ) from None
            except ClientError as e:
                raise Unprocessable(self._user_view(user, str(e))) from None
        return self.status(user, name)

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
        return self.backend(user).list_jobs()

    def status(self, user: str, name: str) -> JobStatus:
        return self._call(user, name, "status")

    def cancel(self, user: str, name: str) -> JobStatus:
        return self._call(user, name, "cancel")

    def logs(self, user: str, name: str, replica: str, follow: bool) -> Iterator[str]:
        """The log's chunks; the first is read here, so an unknown job or replica raises
        before anything is streamed."""
        chunks = self._call(user, name, "logs", replica, follow=follow)
        try:
            first = next(chunks, "")
        except JobNotFoundError as e:
            raise NotFound(self._user_view(user, str(e))) from None
        return itertools.chain([first], chunks)
