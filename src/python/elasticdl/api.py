"""The Python SDK: submit and manage jobs (the ``elasticdl`` command line is a thin layer
over the same calls).

    from elasticdl import api

    job = api.train(
        job_name="mnist",
        model_zoo="model_zoo",
        model_def="mnist.mnist_functional_api.custom_model",
        training_data="data/mnist/train",
        num_workers=2,
    )
    final = api.wait(job.job_name)
    print(final.phase, final.evaluation_metrics)

Keyword arguments are the fields of :class:`JobSpec` with their types (``num_workers=2``, not
``"2"``); a spec built beforehand can be passed instead (``api.train(spec)``). The spec is
completed from the config file and checked exactly like the command line's, so a bad value
raises the same ``ValueError`` (one-line message) and creates nothing. Unlike
``elasticdl train``, the API never follows the job: it returns after submitting (use
:func:`wait` / :func:`logs`).
"""

from __future__ import annotations

import logging
from typing import Any, Iterator

from elasticdl.client.backend import JobBackend, JobHandle, backend_for_job, jobs_everywhere
from elasticdl.client.errors import (
    ArgumentError,
    ClientError,
    JobConflictError,
    JobNotFoundError,
    WaitTimeout,
)
from elasticdl.client.version import __version__
from elasticdl.common.job_spec import JobSpec
from elasticdl.common.job_status import JobStatus, ReplicaStatus
from elasticdl.common.types import JobPhase, JobType, PlatformName, Strategy

__all__ = [
    "train",
    "evaluate",
    "predict",
    "submit",
    "status",
    "wait",
    "cancel",
    "list_jobs",
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
    "WaitTimeout",
    "__version__",
]


def _server_client(platform: str | None = None):
    """The configured job server's client, unless a platform is named."""
    if platform:
        return None
    from elasticdl.client.config import load_config

    config = load_config()
    if config.server is None:
        return None
    from elasticdl.client.server_client import JobServerClient

    return JobServerClient.from_config(config)


def _submit(command: str, spec: JobSpec | None, values: dict[str, Any]) -> JobHandle:
    from elasticdl.client import submit as submitting

    package_path = values.pop("package_path", "")
    if spec is not None:
        if values:
            raise ArgumentError(
                "pass either a JobSpec or keyword arguments, not both "
                "(use spec.replace(...) to change a spec)"
            )
        values = {k: v for k, v in spec.to_dict(only_changed=True).items()}
    client = _server_client(values.get("platform"))
    if client is not None:
        from elasticdl.client.server_backend import handle_of
        from elasticdl.common import job_spec

        spec = job_spec.spec_from_values(command, values)
        package = package_path or spec.model_zoo or "."
        return handle_of(client.submit_job(spec, package_dir=package, command=command))
    if package_path:
        raise ArgumentError(
            "package_path is what a job server runs; configure one or use model_zoo"
        )
    resolved, _ = submitting.spec_from_values(command, values)
    _, handle = submitting.submit(resolved)
    return handle


def train(spec: JobSpec | None = None, /, **values: Any) -> JobHandle:
    """Submit a training job (``elasticdl train --detach``). With a job server configured
    (``server:`` in the config file) the model zoo (``package_path=``, default ``model_zoo``)
    is uploaded and the job runs there; its data paths are paths in your data directory."""
    return _submit("train", spec, values)


def evaluate(spec: JobSpec | None = None, /, **values: Any) -> JobHandle:
    """Submit an evaluation job (``elasticdl evaluate --detach``)."""
    return _submit("evaluate", spec, values)


def predict(spec: JobSpec | None = None, /, **values: Any) -> JobHandle:
    """Submit a prediction job (``elasticdl predict --detach``)."""
    return _submit("predict", spec, values)


def submit(spec: JobSpec) -> JobHandle:
    """Submit a job whose spec says what it does (``job_type``; else derived from its data)."""
    from elasticdl.client import submit as submitting
    from elasticdl.client.config import load_config, with_config

    values = with_config(spec.to_dict(only_changed=True), load_config())
    resolved, _ = JobSpec.from_dict(values).resolve()
    _, handle = submitting.submit(resolved)
    return handle


def _server_backend(platform: str | None) -> JobBackend | None:
    client = _server_client(platform)
    if client is None:
        return None
    from elasticdl.client.server_backend import ServerBackend

    return ServerBackend(client)


def _backend_of(
    name: str, platform: str | None, namespace: str | None, kube_context: str | None
) -> JobBackend:
    """The backend holding job ``name``: the job server if one is configured, the ``platform``
    given, else the job is looked up by name as ``elasticdl status JOB`` does (this machine's
    jobs first, then the configured cluster's namespace; a name in both raises ClientError)."""
    return _server_backend(platform) or backend_for_job(name, platform, namespace, kube_context)


def status(
    name: str,
    platform: str | None = None,
    namespace: str | None = None,
    kube_context: str | None = None,
) -> JobStatus:
    return _backend_of(name, platform, namespace, kube_context).status(name)


def wait(
    name: str,
    timeout: float | None = None,
    platform: str | None = None,
    namespace: str | None = None,
    kube_context: str | None = None,
    poll_interval: float = 1.0,
) -> JobStatus:
    """Block until the job ends; raises :class:`WaitTimeout` after ``timeout`` seconds."""
    return _backend_of(name, platform, namespace, kube_context).wait(
        name, timeout=timeout, poll_interval=poll_interval
    )


def cancel(
    name: str,
    platform: str | None = None,
    namespace: str | None = None,
    kube_context: str | None = None,
) -> JobStatus:
    return _backend_of(name, platform, namespace, kube_context).cancel(name)


def list_jobs(
    platform: str | None = None, namespace: str | None = None, kube_context: str | None = None
) -> list[JobStatus]:
    """The jobs of ``platform``; without one, those of this machine and of the configured
    cluster (a cluster that cannot be asked is logged as a warning, its jobs left out)."""
    server = _server_backend(platform)
    if server is not None:
        return server.list_jobs()
    jobs, warnings = jobs_everywhere(platform, namespace, kube_context)
    for warning in warnings:
        logging.getLogger(__name__).warning("%s", warning)
    return jobs


def logs(
    name: str,
    replica: str = "master",
    follow: bool = False,
    platform: str | None = None,
    namespace: str | None = None,
    kube_context: str | None = None,
) -> Iterator[str]:
    """A replica's log in chunks: ``master``, ``ps-N``, ``worker-N``, or (a job built from a
    package by a job server) ``build``, the image build's log, followed while it runs."""
    return _backend_of(name, platform, namespace, kube_context).logs(name, replica, follow=follow)


def _require_server():
    client = _server_client()
    if client is None:
        raise ClientError(
            "no job server configured; add 'server: {url: ..., token: ...}' to the config file"
        )
    return client


def upload(src: str, dest: str, progress=None) -> list[dict]:
    """Upload a file or directory to your data directory on the job server (``elasticdl
    upload``); ``progress(done_bytes, total_bytes, name)`` is called as it goes."""
    return _require_server().upload(src, dest, progress)


def download(src: str, dest: str, progress=None) -> list[str]:
    """Download a file or directory from your data directory on the job server."""
    return _require_server().download(src, dest, progress)


def server_version() -> dict:
    """The job server's version, API and platform (``elasticdl version``)."""
    return _require_server().version()
