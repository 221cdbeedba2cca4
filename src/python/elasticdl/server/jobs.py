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

import collections
import dataclasses
import itertools
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

from elasticdl.client.backend import JobBackend
from elasticdl.client.errors import ClientError, JobConflictError, JobNotFoundError
from elasticdl.client.local_backend import JOB_FILE, LocalBackend
from elasticdl.common import job_spec, tls
from elasticdl.common.job_status import JobStatus
from elasticdl.common.spec_codec import SpecError
from elasticdl.common.types import PlatformName
from elasticdl.k8s.names import master_pod_name
from elasticdl.server.build_logs import BUILD_REPLICA, BuildLogs
from elasticdl.server.data_store import DataStore, check_relative_path
from elasticdl.server.errors import BadRequest, Conflict, NotFound, Unprocessable
from elasticdl.server.image_builds import BuildRecord, BuildRecords, BuildSettings, ImageBuilds
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
    "tensorboard_log_dir",
    # The job's TLS files too (a local job's spec check reads them, as the server's user).
    *tls.FLAGS,
)
# Spec fields the server sets itself.
SERVER_FIELDS = {
    "model_zoo": "the model zoo is the uploaded package; give 'package' instead",
    "job_dir": "the server keeps job directories itself",
    "cluster_spec": "a file on the server; use cluster_spec_json",
}


BUILT_MODEL_ZOO = "/model_zoo"

# On Kubernetes the server also decides where jobs run and what they mount.
KUBERNETES_SERVER_FIELDS = {
    "job_dir": "jobs on Kubernetes have no job directory",
    "cluster_spec": "a file on the server; use cluster_spec_json",
    "volume": "the server mounts its data volume into every job (data paths are paths in it)",
    "kube_context": "the server uses its own service account",
    "force_use_kube_config_file": "the server uses its own service account",
    "image_name": "give 'image' beside the spec",
    "image_pull_secrets": "the server pulls images with its own --image_pull_secrets",
}


@dataclasses.dataclass(frozen=True)
class KubernetesTarget:
    """Where a server on Kubernetes runs jobs: its namespace, and the volume (a spec
    ``--volume`` value) that holds the users' data directories, mounted at ``data_mount``."""

    namespace: str = "default"
    kube_context: str = ""
    data_volume: str = ""
    image_pull_secrets: str = ""  # --image_pull_secrets, put on every job

    @property
    def data_mount(self) -> str:
        for part in self.data_volume.split(","):
            key, _, value = part.partition("=")
            if key.strip() == "mount_path":
                return value.strip().rstrip("/")
        return ""


@dataclasses.dataclass(frozen=True)
class SubmitRequest:
    command: str
    spec: dict[str, Any]
    package: str = ""
    image: str = ""


def _data_paths(values: dict[str, Any]) -> list[tuple[str, str]]:
    """The spec's data and output paths that are set (``DATA_PATH_FIELDS``), each checked to be
    a string: paths in the user's data directory, which each platform maps its own way."""
    paths = []
    for name in DATA_PATH_FIELDS:
        value = values.get(name)
        if value in (None, ""):
            continue
        if not isinstance(value, str):
            raise Unprocessable(f"spec.{name} must be a string, got {type(value).__name__}")
        paths.append((name, value))
    return paths


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
    ) -> None:
        self.jobs_dir = jobs_dir
        self.packages = packages
        self.data = data
        self.platform = platform
        self.cancel_grace_seconds = cancel_grace_seconds
        self.kubernetes = kubernetes or KubernetesTarget()
        self._backends: dict[str, JobBackend] = {}
        self._lock = threading.Lock()  # one submit at a time: job names are checked, then taken
        self._backends_lock = threading.Lock()
        # Kubernetes: package jobs wait for their image (image_builds.py).
        self.build_settings = builds
        self.records = BuildRecords(state_root or jobs_dir.parent)
        self.build_logs = BuildLogs((state_root or jobs_dir.parent) / "build-logs")
        self.builds: ImageBuilds | None = None

    def start_builds(self) -> None:
        """Start the thread that drives image builds (a server on Kubernetes with builds)."""
        if self.platform != PlatformName.KUBERNETES or self.build_settings is None:
            return
        from elasticdl.server.image_builds import write_builder
        from elasticdl.server.k8s_jobs import OWNER_LABEL

        write_builder(self.records.builds.parent)
        k8s = self.backend("").k8s  # the namespace's client; builds are not one user's
        self.builds = ImageBuilds(
            self.build_settings, self.records, k8s, OWNER_LABEL, self._submit_built, self.build_logs
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
                if self.platform == PlatformName.KUBERNETES:
                    from elasticdl.server.k8s_jobs import OwnedKubernetesBackend

                    backend = OwnedKubernetesBackend(
                        user, self.kubernetes.namespace, self.kubernetes.kube_context
                    )
                else:
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
        if self.platform == PlatformName.KUBERNETES:
            return self._kubernetes_values(user, request)
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
            zoo = self.packages.path(request.package, user=user)
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
        for name, value in _data_paths(values):
            try:
                values[name] = str(self.data.resolve(user, value, what=f"spec.{name}"))
            except BadRequest as e:
                raise Unprocessable(e.reason) from None
        values["model_zoo"] = str(zoo)
        values["platform"] = self.platform
        return values

    def _image(self, user: str, request: SubmitRequest) -> str:
        """The job's image: the given one, or the one built from the package."""
        if request.image and request.package:
            raise Unprocessable("give either image or package, not both")
        if request.image:
            return request.image
        if not request.package:
            raise Unprocessable(
                "give image (built with elasticdl zoo build/push) or package (POST /v1/packages)"
            )
        if self.build_settings is None:
            raise Unprocessable(
                "package: this server builds no images (start it with --build_base_image, "
                "--build_repository and --state_volume); give image instead"
            )
        try:
            self.packages.path(request.package, user=user)
        except NotFound as e:
            raise Unprocessable(f"package: {e.reason}") from None
        return self.build_settings.image_for(request.package)

    def _kubernetes_values(self, user: str, request: SubmitRequest) -> dict[str, Any]:
        image = self._image(user, request)
        values = dict(request.spec)
        for name, why in KUBERNETES_SERVER_FIELDS.items():
            if name in values:
                raise Unprocessable(f"spec.{name} cannot be set: {why}")
        for name, expected in (
            ("platform", PlatformName.KUBERNETES.value),
            ("namespace", self.kubernetes.namespace),
        ):
            value = values.pop(name, None)
            if value not in (None, expected):
                raise Unprocessable(
                    f"spec.{name} {value!r}: this server runs its jobs in {expected}"
                )
        for name, value in _data_paths(values):
            try:
                rel = check_relative_path(value, what=f"spec.{name}")
            except BadRequest as e:
                raise Unprocessable(e.reason) from None
            if not self.kubernetes.data_mount:
                raise Unprocessable(
                    f"spec.{name}: this server has no data volume for its jobs (--data_volume)"
                )
            values[name] = f"{self.kubernetes.data_mount}/{user}/{rel}"
        if request.package:
            if "model_zoo" in values:
                raise Unprocessable(f"spec.model_zoo cannot be set: {SERVER_FIELDS['model_zoo']}")
            # Where the built image holds the package (oci_build, as zoo build's COPY).
            values["model_zoo"] = BUILT_MODEL_ZOO
        else:
            # A given image from `elasticdl zoo build` holds its zoo there too; the SDK and
            # the CLI never send model_zoo (a path on the user's machine), and the master
            # refuses an empty one.
            values.setdefault("model_zoo", BUILT_MODEL_ZOO)
        values["image_name"] = image
        values["platform"] = PlatformName.KUBERNETES.value
        values["namespace"] = self.kubernetes.namespace
        if self.kubernetes.data_volume:
            values["volume"] = self.kubernetes.data_volume
        if self.kubernetes.image_pull_secrets:
            values["image_pull_secrets"] = self.kubernetes.image_pull_secrets
        return values

    def submit(self, user: str, request: SubmitRequest) -> JobStatus:
        values = self._values(user, request)
        try:
            spec = job_spec.spec_from_values(request.command, values)
            if self.platform == PlatformName.LOCAL:
                spec = spec.replace(job_dir=str(self.jobs_dir / user / spec.job_name))
            spec, _ = spec.resolve()
            if self.platform == PlatformName.KUBERNETES and request.package:
                # Checked here, not by the master after a build of minutes.
                job_spec.check_model_zoo(
                    str(self.packages.path(request.package, user=user)), spec.model_def
                )
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
                if self.platform == PlatformName.KUBERNETES:
                    raise Conflict(
                        f"job name {name!r} is taken in namespace {self.kubernetes.namespace}; "
                        "choose another job_name"
                    ) from None
                raise Conflict(
                    f"job {name!r} is still running; cancel it (DELETE /v1/jobs/{name}) or "
                    "choose another job_name"
                ) from None
            except ClientError as e:
                raise Unprocessable(self._user_view(user, str(e))) from None
            self.build_logs.remove(user, name)  # an earlier job's of the same name, if any
        return self.status(user, name)

    def _needs_build(self, request: SubmitRequest, values: dict[str, Any]) -> bool:
        if self.platform != PlatformName.KUBERNETES or request.image or not request.package:
            return False
        return not self.records.pushed(values["image_name"])  # else: built before, reused

    def _record_build(
        self, user: str, request: SubmitRequest, values: dict[str, Any], name: str
    ) -> JobStatus:
        if self.backend(user).k8s.get_pod(master_pod_name(name)) is not None:
            raise Conflict(
                f"job name {name!r} is taken in namespace {self.kubernetes.namespace}; "
                "choose another job_name"
            )
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
