"""In-cluster image builds: a package job on Kubernetes waits for its image, built by a pod.

``POST /v1/jobs`` with a package (and no image) on a server with builds configured: the spec
is checked as for any job, then the job is recorded in ``<state_dir>/builds/<user>/<job>.json``
(phase ``building``) and :meth:`ImageBuilds.reconcile` (a server thread) drives it:

1. the image's name comes from the package id and the base image
   (:meth:`BuildSettings.image_for`); an image this server pushed before
   (``<state_dir>/images/<tag>``) is used as it is;
2. otherwise the build pod ``elasticdl-<job>-build`` runs the BASE image itself, as the
   restricted non-root user, without a service-account token: its init container
   pip-installs the package's ``requirements.txt`` (user code may run there, so it gets no
   registry credentials), its container packs and pushes the image
   (``elasticdl.images.oci_build``, copied to ``<state_dir>/builder/`` and mounted with the
   package from the server's state volume);
3. the pod Succeeded: its log is kept (``build_logs``), the job is submitted with the new
   image (its master pod, as any job), the record and the build pod go. Failed: its log is
   kept and the record turns ``failed`` with the log's last lines, which the job's status
   shows.

The logs API's ``replica=build`` follows the build pod's log while it runs, then serves the
kept log (:meth:`ImageBuilds.follow`).

Everything is in the records and in Kubernetes objects, so a restarted server resumes every
build where it was (a master pod that already exists means the job was submitted). Cancel
deletes the build pod (found by name and labels) and the record.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import inspect
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from elasticdl.common.job_dir import write_atomically
from elasticdl.common.job_status import JobStatus
from elasticdl.common.types import JobPhase, PlatformName
from elasticdl.k8s import security
from elasticdl.k8s.names import APP_LABEL, APP_NAME, LABEL_JOB, LABEL_REPLICA_TYPE
from elasticdl.server.build_logs import CONTAINERS, BuildLogs, pod_log_file, read_build_log

logger = logging.getLogger(__name__)

BUILD_TYPE = "image-build"  # the build pod's elasticdl-replica-type
BUILDER_FILE = "oci_build.py"
LOG_LINES = 20  # of a failed build's log, kept in its record and shown in the job's status
BUILDING, FAILED = "building", "failed"


def build_pod_name(job_name: str) -> str:
    return f"elasticdl-{job_name}-build"


@dataclasses.dataclass(frozen=True)
class BuildSettings:
    """``elasticdl server --build_base_image --build_repository --state_volume ...``."""

    base_image: str  # in the registry of ``repository``; the build pod runs it
    repository: str  # HOST[:PORT]/NAME: where the built images go
    state_volume: str  # claim_name=PVC or host_path=DIR: the volume holding --state_dir
    registry_secret: str = ""  # a Secret with keys username and password (push credentials)
    insecure: bool = False  # plain HTTP to the registry
    host_network: bool = False  # a one-node cluster whose registry is on the node's loopback
    timeout_seconds: int = 1800
    image_pull_secrets: str = ""  # what the kubelet pulls the base image with (comma-separated)

    def image_for(self, package_id: str) -> str:
        """One image per package and base image: the same package on another base is
        another image."""
        base = hashlib.sha256(self.base_image.encode()).hexdigest()[:8]
        return f"{self.repository}:pkg-{package_id[:24]}-{base}"

    def volume_source(self) -> dict[str, Any]:
        key, _, value = self.state_volume.partition("=")
        if key == "claim_name" and value:
            return {"persistentVolumeClaim": {"claimName": value, "readOnly": True}}
        if key == "host_path" and value:
            return {"hostPath": {"path": value, "type": "Directory"}}
        raise ValueError(
            f"--state_volume {self.state_volume!r}: use claim_name=PVC or host_path=DIR "
            "(the volume holding --state_dir)"
        )


@dataclasses.dataclass
class BuildRecord:
    """A package job waiting for its image (or whose build failed)."""

    job_name: str
    owner: str
    command: str
    values: dict[str, Any]  # the spec's values, image_name included
    package: str
    image: str
    phase: str = BUILDING
    message: str = ""
    created_at: float = 0.0

    def status(self, namespace: str) -> JobStatus:
        if self.phase == FAILED:
            phase, message = JobPhase.FAILED, self.message
        else:
            phase = JobPhase.PENDING
            message = self.message or f"building image {self.image}"
        return JobStatus(
            job_name=self.job_name,
            platform=PlatformName.KUBERNETES.value,
            job_type=self.command,
            phase=phase,
            message=message,
            created_at=self.created_at,
            updated_at=time.time(),
            namespace=namespace,
        )


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(data))


class BuildRecords:
    """``<state_dir>/builds/<user>/<job>.json`` and ``<state_dir>/images/<tag>``."""

    def __init__(self, root: Path) -> None:
        self.builds = root / "builds"
        self.images = root / "images"

    def path(self, owner: str, job_name: str) -> Path:
        return self.builds / owner / f"{job_name}.json"

    def save(self, record: BuildRecord) -> None:
        _write_json(self.path(record.owner, record.job_name), dataclasses.asdict(record))

    def get(self, owner: str, job_name: str) -> BuildRecord | None:
        try:
            return BuildRecord(**json.loads(self.path(owner, job_name).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def remove(self, owner: str, job_name: str) -> None:
        self.path(owner, job_name).unlink(missing_ok=True)

    def of(self, owner: str) -> list[BuildRecord]:
        records = (self.get(owner, p.stem) for p in sorted((self.builds / owner).glob("*.json")))
        return [r for r in records if r is not None]

    def all(self) -> list[BuildRecord]:
        if not self.builds.is_dir():
            return []
        return [r for d in sorted(self.builds.iterdir()) if d.is_dir() for r in self.of(d.name)]

    def taken(self, job_name: str) -> bool:
        return any((d / f"{job_name}.json").is_file() for d in self.builds.glob("*"))

    def _marker(self, image: str) -> Path:
        return self.images / image.rpartition(":")[2]

    def pushed(self, image: str) -> bool:
        return self._marker(image).is_file()

    def mark_pushed(self, image: str) -> None:
        _write_json(self._marker(image), {"image": image, "pushed_at": time.time()})


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
    """The build pod's manifest (a dict the API takes as it is)."""
    package = "/package"
    stage = "/work/stage"
    program = ["python3", f"/builder/{BUILDER_FILE}"]
    mounts = [
        {
            "name": "state",
            "mountPath": package,
            "subPath": f"packages/{record.package}",
            "readOnly": True,
        },
        {"name": "state", "mountPath": "/builder", "subPath": "builder", "readOnly": True},
        {"name": "work", "mountPath": "/work"},
        {"name": security.TMP_VOLUME, "mountPath": security.TMP_PATH},
    ]
    env = [
        {"name": security.HOME_ENV, "value": security.TMP_PATH},
        {"name": "TMPDIR", "value": "/work"},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
    ]
    container_security = {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }
    push_env = list(env)
    if settings.registry_secret:
        for var, key in (
            ("ELASTICDL_REGISTRY_USERNAME", "username"),
            ("ELASTICDL_REGISTRY_PASSWORD", "password"),
        ):
            push_env.append(
                {
                    "name": var,
                    "valueFrom": {"secretKeyRef": {"name": settings.registry_secret, "key": key}},
                }
            )
    push = (
        program
        + [
            "push",
            f"--package={package}",
            f"--stage={stage}",
            f"--base={settings.base_image}",
            f"--target={record.image}",
        ]
        + (["--insecure"] if settings.insecure else [])
    )
    resources = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # The build runs the user's requirements: no token to the API server.
        "automountServiceAccountToken": False,
        "activeDeadlineSeconds": settings.timeout_seconds,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": security.RUN_AS_USER,
            "runAsGroup": security.RUN_AS_GROUP,
            "fsGroup": security.RUN_AS_GROUP,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": [
            {
                "name": "install",
                "image": settings.base_image,
                "command": program + ["install", f"--package={package}", f"--stage={stage}"],
                "env": env,
                "volumeMounts": mounts,
                "securityContext": container_security,
                "resources": resources,
            }
        ],
        "containers": [
            {
                "name": "push",
                "image": settings.base_image,
                "command": push,
                "env": push_env,
                "volumeMounts": mounts,
                "securityContext": container_security,
                "resources": resources,
            }
        ],
        "volumes": [
            {"name": "state", **settings.volume_source()},
            {"name": "work", "emptyDir": {}},
            {"name": security.TMP_VOLUME, "emptyDir": {}},
        ],
    }
    if settings.host_network:
        spec["hostNetwork"] = True
    pull = [s.strip() for s in settings.image_pull_secrets.split(",") if s.strip()]
    if pull:
        spec["imagePullSecrets"] = [{"name": secret} for secret in pull]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": build_pod_name(record.job_name),
            "namespace": namespace,
            "labels": {
                APP_LABEL: APP_NAME,
                LABEL_JOB: record.job_name,
                LABEL_REPLICA_TYPE: BUILD_TYPE,
                owner_label: record.owner,
            },
        },
        "spec": spec,
    }


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
    ) -> None:
        self.settings = settings
        self.records = records
        self.build_logs = build_logs
        self.k8s = k8s
        self.owner_label = owner_label
        self.submit = submit
        self.interval = interval
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
            record.phase = FAILED
            record.message = f"image build failed: {self._log_tail(text, pod)}"
            self.records.save(record)
            self.k8s.delete_pod(name, grace_seconds=0)
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
        self.records.remove(record.owner, record.job_name)
        self.k8s.delete_pod(build_pod_name(record.job_name), grace_seconds=0)

    def _keep_log(self, record: BuildRecord) -> str:
        """Keep the ended build pod's log (before the pod goes); answers it."""
        text = read_build_log(self.k8s, build_pod_name(record.job_name))
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
            text = read_build_log(self.k8s, build_pod_name(record.job_name))
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
        path = pod_log_file(self.k8s.namespace, name)
        if path is not None:
            yield from self._follow_file(record, name, path, poll)
            return
        for container in CONTAINERS:
            if not self._wait_started(record, name, container, poll):
                return
            try:
                yield from self.k8s.follow_pod_log(name, container=container)
            except Exception as e:  # the pod was deleted under the stream
                logger.info("image builds: stopped following %s/%s: %s", name, container, e)
                return

    def _wait_started(self, record: BuildRecord, name: str, container: str, poll: float) -> bool:
        """Wait until ``container`` of the build pod has started (True), or until it never
        will: the pod ended or went, or the build is no longer in progress (False)."""
        while self._building(record):
            pod = self._pod(name)
            if pod is not None and pod.status is not None:
                statuses = (pod.status.init_container_statuses or []) + (
                    pod.status.container_statuses or []
                )
                for status in statuses:
                    state = status.state
                    if status.name == container and state and (state.running or state.terminated):
                        return True
                if pod.status.phase in ("Succeeded", "Failed"):
                    return False
            time.sleep(poll)
        return False

    def _follow_file(self, record: BuildRecord, name: str, path, poll: float) -> Iterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        offset = 0
        while True:
            # Ended is seen before the last read, so that read has all the pod wrote.
            pod = self._pod(name)
            phase = pod.status.phase if pod is not None and pod.status else None
            ended = phase in ("Succeeded", "Failed") or not self._building(record)
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:
                data = b""
            offset += len(data)
            text = decoder.decode(data, final=ended)
            if text:
                yield text
            if ended:
                return
            time.sleep(poll)
