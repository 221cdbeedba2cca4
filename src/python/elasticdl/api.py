"""The Python SDK: submit and manage jobs (the ``elasticdl`` command line is a thin layer
over these calls).

    from elasticdl import api

    job = api.train(
        job_name="mnist",
        model_zoo="model_zoo",
        model_def="mnist.mnist_functional_api.custom_model",
        training_data="data/mnist/train",
        num_workers=2,
    )
    final = api.wait(job)
    print(final.phase, final.evaluation_metrics)

Keyword arguments are the fields of :class:`JobSpec` with their types (``num_workers=2``, not
``"2"``); a spec built beforehand can be passed instead (``api.train(spec)``). The spec is
completed from the config file and checked exactly like the command line's, so a bad value
raises the same ``ValueError`` (one-line message) and creates nothing. Unlike
``elasticdl train``, the API never follows the job: it returns after submitting (use
:func:`wait` / :func:`logs`). A job is named by its name or by the :class:`JobHandle` its
submit returned (which also knows where it runs).

Where jobs go and where a job is found is decided in one place,
:func:`elasticdl.jobs.routing.backend_for`: the job server of the config file (``server:``)
unless a platform is named, else the named platform, else this machine's jobs and the
configured cluster's.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Callable, Iterator

from elasticdl.common.job_spec import JobSpec
from elasticdl.common.job_status import JobStatus, ReplicaStatus
from elasticdl.common.types import JobPhase, JobType, PlatformName, Strategy
from elasticdl.jobs.backend import JobBackend, JobHandle, Progress
from elasticdl.jobs.config import load_config
from elasticdl.jobs.errors import (
    ArgumentError,
    ClientError,
    JobConflictError,
    JobNotFoundError,
    NoJobServerError,
    WaitTimeout,
)
from elasticdl.jobs.routing import backend_for, required_job_server
from elasticdl.version import __version__

__all__ = [
    "train",
    "evaluate",
    "predict",
    "submit",
    "status",
    "wait",
    "cancel",
    "list_jobs",
    "scale_ps",
    "logs",
    "upload",
    "download",
    "server_version",
    "JobSpec",
    "JobHandle",
    "JobStatus",
    "ReplicaStatus",
    "JobPhase",
    "JobType",
    "PlatformName",
    "Strategy",
    "ArgumentError",
    "ClientError",
    "JobNotFoundError",
    "JobConflictError",
    "NoJobServerError",
    "WaitTimeout",
    "__version__",
]

logger = logging.getLogger(__name__)

Job = str | JobHandle


def _submit(command: str | None, spec: JobSpec | None, values: dict[str, Any]) -> JobHandle:
    package_path = values.pop("package_path", "")
    yaml_path = values.pop("yaml_path", "")
    progress: Progress | None = values.pop("progress", None)
    if spec is not None:
        if values:
            raise ArgumentError(
                "pass either a JobSpec or keyword arguments, not both "
                "(use spec.replace(...) to change a spec)"
            )
        values = spec.to_dict(only_changed=True)
    config = load_config()
    backend = backend_for(
        values.get("platform"), values.get("namespace"), values.get("kube_context"), config=config
    )
    job, notices = backend.prepare(command, values, config)
    if yaml_path and job.platform not in (None, PlatformName.KUBERNETES):
        raise ArgumentError(
            "--yaml writes a Kubernetes manifest; use it with --platform=kubernetes and --image_name"
        )
    if job.image_base and job.platform == PlatformName.KUBERNETES:
        # The build form: the model-zoo image is built and pushed first (progress on stderr).
        from elasticdl.client import zoo_image

        job, built = zoo_image.prepare(job)
        for notice in built:
            print(f"elasticdl: {notice}", file=sys.stderr, flush=True)
    handle = backend.submit(job, yaml_path=yaml_path, package_path=package_path, progress=progress)
    handle.notices = notices + handle.notices  # then what the submission found
    return handle


def train(spec: JobSpec | None = None, /, **values: Any) -> JobHandle:
    """Submit a training job (``elasticdl train --detach``). With a job server configured
    (``server:`` in the config file) the model zoo (``package_path=``, default ``model_zoo``)
    is uploaded (``progress=``: called with done bytes, all bytes and a file name as it goes)
    and the job runs there; its data paths are paths in your data directory. ``yaml_path=``
    (Kubernetes): only write the master's manifest there."""
    return _submit("train", spec, values)


def evaluate(spec: JobSpec | None = None, /, **values: Any) -> JobHandle:
    """Submit an evaluation job (``elasticdl evaluate --detach``); see :func:`train`."""
    return _submit("evaluate", spec, values)


def predict(spec: JobSpec | None = None, /, **values: Any) -> JobHandle:
    """Submit a prediction job (``elasticdl predict --detach``); see :func:`train`."""
    return _submit("predict", spec, values)


def submit(spec: JobSpec, package_path: str = "") -> JobHandle:
    """Submit a job whose spec says what it does (``job_type``; else derived from its data),
    where :func:`train` would."""
    return _submit(None, spec, {"package_path": package_path})


def _backend_of(
    job: Job, platform: str | None, namespace: str | None, kube_context: str | None
) -> tuple[JobBackend, str]:
    """The backend holding ``job`` and its name. A handle says where its job runs; a name is
    looked up as ``elasticdl status JOB`` does."""
    if isinstance(job, JobHandle):
        if not job.server:  # else: the configured job server
            platform = platform or job.platform
            namespace = namespace or job.namespace or None
            kube_context = kube_context or job.kube_context or None
        job = job.job_name
    return backend_for(platform, namespace, kube_context), job


def status(
    job: Job,
    platform: str | None = None,
    namespace: str | None = None,
    kube_context: str | None = None,
) -> JobStatus:
    backend, name = _backend_of(job, platform, namespace, kube_context)
    return backend.status(name)


def wait(
    job: Job,
    timeout: float | None = None,
    platform: str | None = None,
    namespace: str | None = None,
    kube_context: str | None = None,
    poll_interval: float = 1.0,
) -> JobStatus:
    """Block until the job ends; raises :class:`WaitTimeout` after ``timeout`` seconds."""
    backend, name = _backend_of(job, platform, namespace, kube_context)
    return backend.wait(name, timeout=timeout, poll_interval=poll_interval)


def cancel(
    job: Job,
    platform: str | None = None,
    namespace: str | None = None,
    kube_context: str | None = None,
) -> JobStatus:
    backend, name = _backend_of(job, platform, namespace, kube_context)
    return backend.cancel(name)


def scale_ps(
    job: Job,
    num_ps: int,
    platform: str | None = None,
    namespace: str | None = None,
    kube_context: str | None = None,
    timeout: float | None = None,
) -> str:
    """Change a running ParameterServerStrategy job's PS count to ``num_ps`` (re-sharding its
    model; training pauses meanwhile); returns the master's one-line answer, waited for at
    most ``timeout`` seconds (None: 30 s for a local job, 60 s on Kubernetes). The change
    runs on in the job: ``status(job).ps_scaling`` shows it."""
    if isinstance(num_ps, bool) or not isinstance(num_ps, int) or num_ps < 1:
        raise ArgumentError(f"--num_ps must be an integer >= 1, got {num_ps!r}")
    if timeout is not None and not (0 < timeout < float("inf")):  # nan too
        raise ArgumentError(f"--timeout must be a finite number of seconds > 0, got {timeout!r}")
    backend, name = _backend_of(job, platform, namespace, kube_context)
    return backend.scale_ps(name, num_ps, timeout=timeout)


def list_jobs(
    platform: str | None = None,
    namespace: str | None = None,
    kube_context: str | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> list[JobStatus]:
    """The jobs of ``platform``; without one, those of this machine and of the configured
    cluster (a cluster that cannot be asked goes to ``on_warning``, default: a logged
    warning, and its jobs are left out)."""
    backend = backend_for(platform, namespace, kube_context)
    jobs = backend.list_jobs()
    for warning in backend.warnings:
        (on_warning or logger.warning)(warning)
    return jobs


def logs(
    job: Job,
    replica: str = "master",
    follow: bool = False,
    platform: str | None = None,
    namespace: str | None = None,
    kube_context: str | None = None,
) -> Iterator[str]:
    """A replica's log in chunks: ``master``, ``ps-N``, ``worker-N``, or (a job built from a
    package by a job server) ``build``, the image build's log, followed while it runs."""
    backend, name = _backend_of(job, platform, namespace, kube_context)
    return backend.logs(name, replica, follow=follow)


def upload(src: str, dest: str, progress: Progress | None = None) -> list[dict]:
    """Upload a file or directory to your data directory on the job server (``elasticdl
    upload``); ``progress(done_bytes, total_bytes, name)`` is called as it goes."""
    return required_job_server("upload").upload(src, dest, progress)


def download(src: str, dest: str, progress: Progress | None = None) -> list[str]:
    """Download a file or directory from your data directory on the job server."""
    return required_job_server("download").download(src, dest, progress)


def server_version() -> dict:
    """The job server's version, API, platform and your user name (``elasticdl version``),
    and its ``url``; :class:`NoJobServerError` without a job server in the config file."""
    client = required_job_server("server_version")
    return {**client.version(), "url": client.url}
