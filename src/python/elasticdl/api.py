"""Python API mirroring the ``elasticdl`` command line.

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

Keyword arguments are named like the command-line flags (``num_workers`` for
``--num_workers``); values may be strings, numbers or booleans. They go through the same
parser, config file, defaults and validation as the CLI, so an invalid value raises the same
``ValueError`` (one-line message) and creates nothing. Unlike ``elasticdl train``, the API
never follows the job: it returns after submitting (use :func:`wait` / :func:`logs`).
"""

from __future__ import annotations

from typing import Any, Iterator

from elasticdl.client.backend import JobBackend, JobHandle, get_backend
from elasticdl.client.config import apply_config, load_config
from elasticdl.client.errors import (
    ArgumentError,
    ClientError,
    JobConflictError,
    JobNotFoundError,
    WaitTimeout,
)
from elasticdl.client.job_status import JobPhase, JobStatus, ReplicaStatus
from elasticdl.client.version import __version__

__all__ = [
    "train",
    "evaluate",
    "predict",
    "status",
    "wait",
    "cancel",
    "list_jobs",
    "logs",
    "JobHandle",
    "JobStatus",
    "ReplicaStatus",
    "JobPhase",
    "ArgumentError",
    "ClientError",
    "JobNotFoundError",
    "JobConflictError",
    "WaitTimeout",
    "__version__",
]


def _to_argv(kwargs: dict[str, Any]) -> list[str]:
    argv = []
    for key, value in kwargs.items():
        if value is None:
            continue
        if key.startswith("-"):
            raise ArgumentError(
                f"pass {key!r} as {key.lstrip('-')}=... (keyword arguments are named like the flags)"
            )
        if isinstance(value, bool):
            value = "true" if value else "false"
        argv.append(f"--{key}={value}")
    return argv


def _submit(command: str, kwargs: dict[str, Any]) -> JobHandle:
    from elasticdl.client.job_commands import job_parser
    from elasticdl.client.submit import prepare_job, submit_job

    if "detach" in kwargs:
        raise ArgumentError(
            "detach is not an API argument: the API always returns after submitting"
        )
    argv = _to_argv(kwargs)
    args = job_parser(command).parse_args(argv)
    prepare_job(args, argv)
    _, handle = submit_job(args)
    return handle


def train(**kwargs: Any) -> JobHandle:
    """Submit a training job (``elasticdl train --detach``)."""
    return _submit("train", kwargs)


def evaluate(**kwargs: Any) -> JobHandle:
    """Submit an evaluation job (``elasticdl evaluate --detach``)."""
    return _submit("evaluate", kwargs)


def predict(**kwargs: Any) -> JobHandle:
    """Submit a prediction job (``elasticdl predict --detach``)."""
    return _submit("predict", kwargs)


def _backend(platform: str | None, namespace: str | None, kube_context: str | None) -> JobBackend:
    class _Target:  # the same defaulting as the CLI: explicit > config file > built-in
        pass

    target = _Target()
    target.platform = platform or "local"
    target.namespace = namespace or "default"
    target.kube_context = kube_context or ""
    given = [
        f"--{k}"
        for k, v in (
            ("platform", platform),
            ("namespace", namespace),
            ("kube_context", kube_context),
        )
        if v
    ]
    apply_config(target, given, load_config())
    return get_backend(target.platform, target.namespace, target.kube_context)


def status(
    name: str,
    platform: str | None = None,
    namespace: str | None = None,
    kube_context: str | None = None,
) -> JobStatus:
    return _backend(platform, namespace, kube_context).status(name)


def wait(
    name: str,
    timeout: float | None = None,
    platform: str | None = None,
    namespace: str | None = None,
    kube_context: str | None = None,
    poll_interval: float = 1.0,
) -> JobStatus:
    """Block until the job ends; raises :class:`WaitTimeout` after ``timeout`` seconds."""
    return _backend(platform, namespace, kube_context).wait(
        name, timeout=timeout, poll_interval=poll_interval
    )


def cancel(
    name: str,
    platform: str | None = None,
    namespace: str | None = None,
    kube_context: str | None = None,
) -> JobStatus:
    return _backend(platform, namespace, kube_context).cancel(name)


def list_jobs(
    platform: str | None = None, namespace: str | None = None, kube_context: str | None = None
) -> list[JobStatus]:
    return _backend(platform, namespace, kube_context).list_jobs()


def logs(
    name: str,
    replica: str = "master",
    follow: bool = False,
    platform: str | None = None,
    namespace: str | None = None,
    kube_context: str | None = None,
) -> Iterator[str]:
    return _backend(platform, namespace, kube_context).logs(name, replica, follow=follow)
