"""Where the server runs jobs (``elasticdl server --platform``), decided once: a placement
makes each user's job backend and completes a submitted spec with what the server decides,
not the user: where the model zoo is (the uploaded package, or the image), where the job
directory is, the platform. Data and output paths in the spec are paths in the user's data
directory (``--training_data=mnist/train``) and cannot leave it.
"""

from __future__ import annotations

import abc
import dataclasses
from pathlib import Path
from typing import Any

from elasticdl.common import job_spec, tls
from elasticdl.common.job_spec import JobSpec
from elasticdl.common.types import PlatformName
from elasticdl.jobs.backend import JobBackend
from elasticdl.jobs.job_request import JobRequest
from elasticdl.k8s.pod_logs import PodLogs
from elasticdl.server.data_store import DataStore, check_relative_path
from elasticdl.server.errors import BadRequest, NotFound, Unprocessable
from elasticdl.server.image_build_records import BuildSettings
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
# Where an image built from a package holds it (oci_build, as zoo build's COPY).
BUILT_MODEL_ZOO = "/model_zoo"


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


def data_paths(values: dict[str, Any]) -> list[tuple[str, str]]:
    """The spec's data and output paths that are set (``DATA_PATH_FIELDS``), each checked to be
    a string: paths in the user's data directory, which each placement maps its own way."""
    paths = []
    for name in DATA_PATH_FIELDS:
        value = values.get(name)
        if value in (None, ""):
            continue
        if not isinstance(value, str):
            raise Unprocessable(f"spec.{name} must be a string, got {type(value).__name__}")
        paths.append((name, value))
    return paths


def _refuse(values: dict[str, Any], fields: dict[str, str]) -> None:
    for name, why in fields.items():
        if name in values:
            raise Unprocessable(f"spec.{name} cannot be set: {why}")


class Placement(abc.ABC):
    """See the module docstring. Raises ``Unprocessable`` for what the server refuses."""

    platform: str = ""
    builds_images = False  # whether a package job waits for an image built from its package

    def __init__(self, packages: PackageStore) -> None:
        self.packages = packages

    @abc.abstractmethod
    def backend(self, user: str) -> JobBackend:
        """A new backend for ``user``'s jobs."""

    @abc.abstractmethod
    def values(self, user: str, request: JobRequest) -> dict[str, Any]:
        """The spec's values of ``request``, completed with what the server decides."""

    def place(self, user: str, spec: JobSpec) -> JobSpec:
        """The spec before it is resolved, with what depends on its name."""
        return spec

    def check(self, user: str, request: JobRequest, spec: JobSpec) -> None:
        """What the resolved spec must satisfy here (``SpecError``)."""

    @abc.abstractmethod
    def taken(self, name: str) -> str:
        """Why a job name the backend refused as taken cannot be used."""

    def _package_dir(self, package: str, user: str) -> Path:
        """The package's directory, if ``user`` uploaded it."""
        try:
            return self.packages.path(package, user=user)
        except NotFound as e:
            raise Unprocessable(f"package: {e.reason}") from None


class LocalPlacement(Placement):
    """Local processes as the server's user, one job directory tree per user."""

    platform = PlatformName.LOCAL

    def __init__(
        self,
        packages: PackageStore,
        data: DataStore,
        jobs_dir: Path,
        cancel_grace_seconds: float = 15.0,
    ) -> None:
        super().__init__(packages)
        self.data = data
        self.jobs_dir = jobs_dir
        self.cancel_grace_seconds = cancel_grace_seconds

    def backend(self, user: str) -> JobBackend:
        from elasticdl.jobs.local_backend import LocalBackend

        return LocalBackend(
            root=self.jobs_dir / user, cancel_grace_seconds=self.cancel_grace_seconds
        )

    def values(self, user: str, request: JobRequest) -> dict[str, Any]:
        if request.image and not request.package:
            raise Unprocessable(
                "image: this server runs local jobs from packages; upload the model zoo "
                "(POST /v1/packages) and give 'package'"
            )
        if not request.package:
            raise Unprocessable(
                "package is required: upload the model zoo with POST /v1/packages first"
            )
        zoo = self._package_dir(request.package, user)
        values = dict(request.spec)
        _refuse(values, SERVER_FIELDS)
        platform = values.pop("platform", None)
        if platform not in (None, self.platform):
            raise Unprocessable(
                f"spec.platform {platform!r}: this server runs {self.platform} jobs; drop the field"
            )
        for name, value in data_paths(values):
            try:
                values[name] = str(self.data.resolve(user, value, what=f"spec.{name}"))
            except BadRequest as e:
                raise Unprocessable(e.reason) from None
        values["model_zoo"] = str(zoo)
        values["platform"] = self.platform
        return values

    def place(self, user: str, spec: JobSpec) -> JobSpec:
        return spec.replace(job_dir=str(self.jobs_dir / user / spec.job_name))

    def taken(self, name: str) -> str:
        return (
            f"job {name!r} is still running; cancel it (DELETE /v1/jobs/{name}) or "
            "choose another job_name"
        )


class KubernetesPlacement(Placement):
    """Pods in the server's namespace, each master labelled with its owner; a package runs
    in an image built from it (``builds``), a given image as it is."""

    platform = PlatformName.KUBERNETES
    builds_images = True

    def __init__(
        self,
        packages: PackageStore,
        target: KubernetesTarget,
        builds: BuildSettings | None = None,
        pod_logs: PodLogs | None = None,
    ) -> None:
        super().__init__(packages)
        self.target = target
        self.builds = builds
        self.pod_logs = pod_logs

    def backend(self, user: str) -> JobBackend:
        from elasticdl.server.k8s_jobs import OwnedKubernetesBackend

        return OwnedKubernetesBackend(
            user, self.target.namespace, self.target.kube_context, pod_logs=self.pod_logs
        )

    def _image(self, user: str, request: JobRequest) -> str:
        """The job's image: the given one, or the one built from the package."""
        if request.image and request.package:
            raise Unprocessable("give either image or package, not both")
        if request.image:
            return request.image
        if not request.package:
            raise Unprocessable(
                "give image (built with elasticdl zoo build/push) or package (POST /v1/packages)"
            )
        if self.builds is None:
            raise Unprocessable(
                "package: this server builds no images (start it with --build_base_image, "
                "--build_repository and --state_volume); give image instead"
            )
        self._package_dir(request.package, user)
        return self.builds.image_for(request.package)

    def values(self, user: str, request: JobRequest) -> dict[str, Any]:
        image = self._image(user, request)
        values = dict(request.spec)
        _refuse(values, KUBERNETES_SERVER_FIELDS)
        for name, expected in (
            ("platform", PlatformName.KUBERNETES.value),
            ("namespace", self.target.namespace),
        ):
            value = values.pop(name, None)
            if value not in (None, expected):
                raise Unprocessable(
                    f"spec.{name} {value!r}: this server runs its jobs in {expected}"
                )
        for name, value in data_paths(values):
            try:
                rel = check_relative_path(value, what=f"spec.{name}")
            except BadRequest as e:
                raise Unprocessable(e.reason) from None
            if not self.target.data_mount:
                raise Unprocessable(
                    f"spec.{name}: this server has no data volume for its jobs (--data_volume)"
                )
            values[name] = f"{self.target.data_mount}/{user}/{rel}"
        if request.package:
            if "model_zoo" in values:
                raise Unprocessable(f"spec.model_zoo cannot be set: {SERVER_FIELDS['model_zoo']}")
            values["model_zoo"] = BUILT_MODEL_ZOO
        else:
            # A given image from `elasticdl zoo build` holds its zoo there too; the SDK and
            # the CLI never send model_zoo (a path on the user's machine), and the master
            # refuses an empty one.
            values.setdefault("model_zoo", BUILT_MODEL_ZOO)
        values["image_name"] = image
        values["platform"] = PlatformName.KUBERNETES.value
        values["namespace"] = self.target.namespace
        if self.target.data_volume:
            values["volume"] = self.target.data_volume
        if self.target.image_pull_secrets:
            values["image_pull_secrets"] = self.target.image_pull_secrets
        return values

    def check(self, user: str, request: JobRequest, spec: JobSpec) -> None:
        if request.package:
            # Checked here, not by the master after a build of minutes.
            package = self.packages.path(request.package, user=user)
            job_spec.check_model_zoo(str(package), spec.model_def)

    def taken(self, name: str) -> str:
        return (
            f"job name {name!r} is taken in namespace {self.target.namespace}; "
            "choose another job_name"
        )
