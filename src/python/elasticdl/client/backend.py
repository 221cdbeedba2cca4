"""The interface every job backend implements, and how the client picks one.

A backend owns the lifecycle of jobs on one platform: ``LocalBackend`` (jobs are process
trees on this machine, the default) and ``elasticdl.client.k8s_backend.KubernetesBackend``
(jobs are a master pod plus the pods it creates). The CLI and ``elasticdl.api`` only talk to
this interface, so every command works the same on both.
"""

from __future__ import annotations

import abc
import dataclasses
import re
import time
from typing import TYPE_CHECKING, Callable, Iterator

from elasticdl.client.errors import ClientError, WaitTimeout
from elasticdl.common.job_status import JobStatus
from elasticdl.common.types import PlatformName

if TYPE_CHECKING:
    from elasticdl.common.job_spec import JobSpec


@dataclasses.dataclass
class JobHandle:
    """What ``submit`` returns: enough to find the job again."""

    job_name: str
    platform: str
    created_at: float
    namespace: str = ""
    job_dir: str = ""  # local platform
    pid: int | None = None  # local platform: the master's process (group leader)
    master: str = ""  # Kubernetes: the master pod name
    yaml_path: str = (
        ""  # Kubernetes with --yaml: where the manifest was written (nothing submitted)
    )


class JobBackend(abc.ABC):
    """Lifecycle of ElasticDL jobs on one platform. Methods raise ``ValueError`` subclasses
    (see ``elasticdl.client.errors``) for user errors such as an unknown job name."""

    platform: str = ""

    @abc.abstractmethod
    def submit(self, spec: "JobSpec", yaml_path: str = "") -> JobHandle:
        """Start the job of a resolved spec (``JobSpec.resolve``). ``yaml_path``: only write
        the job's manifest there (platforms that have one)."""

    @abc.abstractmethod
    def list_jobs(self) -> list[JobStatus]:
        """All jobs this backend knows, oldest first."""

    @abc.abstractmethod
    def status(self, name: str) -> JobStatus:
        """Current status; raises ``JobNotFoundError`` for an unknown job."""

    @abc.abstractmethod
    def logs(self, name: str, replica: str = "master", follow: bool = False) -> Iterator[str]:
        """Log text of one replica ("master", "worker-0", "ps-0") in chunks; with ``follow``
        keep yielding until the replica (or the job) has ended."""

    @abc.abstractmethod
    def cancel(self, name: str) -> JobStatus:
        """Stop the job and everything it started; returns the final status."""

    def wait(
        self, name: str, timeout: float | None = None, poll_interval: float = 1.0
    ) -> JobStatus:
        """Block until the job reaches a final phase; raises ``WaitTimeout`` after ``timeout``
        seconds (None: no limit)."""
        return wait_until_final(self.status, name, timeout, poll_interval)


def wait_until_final(
    read_status: Callable[[str], JobStatus],
    name: str,
    timeout: float | None,
    poll_interval: float,
) -> JobStatus:
    """Poll ``read_status(name)`` until the job is in a final phase (what every ``wait`` of a
    backend or the job server's SDK does); ``WaitTimeout`` after ``timeout`` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        status = read_status(name)
        if status.is_final:
            return status
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(f"job {name} is still {status.phase} after {timeout:g}s")
        time.sleep(
            poll_interval
            if deadline is None
            else max(0.0, min(poll_interval, deadline - time.monotonic()))
        )


def get_backend(
    platform: str | None, namespace: str = "default", kube_context: str = ""
) -> JobBackend:
    """The backend for ``platform`` (None/"" = local). Kubernetes support is imported only
    here, so a laptop user never loads the Kubernetes SDK."""
    platform = platform or PlatformName.LOCAL
    if platform == PlatformName.LOCAL:
        from elasticdl.client.local_backend import LocalBackend

        return LocalBackend()
    if platform == PlatformName.KUBERNETES:
        try:
            from elasticdl.client.k8s_backend import KubernetesBackend
        except ImportError as e:
            raise ClientError(
                f"the Kubernetes platform is not available ({e}); install the 'kubernetes' package "
                "or use --platform=local"
            ) from None
        return KubernetesBackend(namespace=namespace or "default", kube_context=kube_context or "")
    raise ClientError(
        f"--platform {platform!r} is invalid; use one of {', '.join(p.value for p in PlatformName)}"
    )


def backend_for_target(
    platform: str | None = None, namespace: str | None = None, kube_context: str | None = None
) -> JobBackend:
    """The backend that manages existing jobs: what is given, else the config file, else
    local / default / the current kubeconfig context."""
    from elasticdl.client.config import load_config, with_config

    given = {
        k: v
        for k, v in (
            ("platform", platform),
            ("namespace", namespace),
            ("kube_context", kube_context),
        )
        if v
    }
    target = with_config(given, load_config())
    return get_backend(
        target.get("platform") or PlatformName.LOCAL,
        target.get("namespace") or "default",
        target.get("kube_context") or "",
    )


def _job_server_configured() -> bool:
    """A job server in the config file knows every job: it is asked, not the platforms."""
    from elasticdl.client.config import load_config

    return getattr(load_config(), "server", None) is not None


def _cluster_configured(target: dict) -> bool:
    """Whether commands that look a job up should also ask a Kubernetes cluster: the config
    file names the platform or a context, or credentials exist (``$KUBECONFIG``,
    ``~/.kube/config``, a pod's service account)."""
    import os

    from elasticdl.k8s.client import in_cluster

    if target.get("platform") == PlatformName.KUBERNETES or target.get("kube_context"):
        return True
    kubeconfig = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    return bool(kubeconfig) or os.path.exists(os.path.expanduser("~/.kube/config")) or in_cluster()


def _lookup_target(
    namespace: str | None, kube_context: str | None
) -> tuple[JobBackend, JobBackend | None, str]:
    """(local backend, the configured cluster's backend or None, its namespace)."""
    from elasticdl.client.config import load_config, with_config

    given = {k: v for k, v in (("namespace", namespace), ("kube_context", kube_context)) if v}
    target = with_config(given, load_config())
    local = get_backend(PlatformName.LOCAL)
    ns = target.get("namespace") or "default"
    if not _cluster_configured(target):
        return local, None, ns
    try:
        cluster = get_backend(PlatformName.KUBERNETES, ns, target.get("kube_context") or "")
    except ClientError:  # no Kubernetes SDK in this installation: local jobs only
        if target.get("platform") == PlatformName.KUBERNETES:
            raise
        return local, None, ns
    return local, cluster, ns


def _valid_job_name(name: str) -> bool:
    from elasticdl.common.job_spec import MAX_JOB_NAME_LENGTH

    return bool(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)) and (
        len(name) <= MAX_JOB_NAME_LENGTH
    )


def _holds(backend: JobBackend, name: str) -> bool:
    from elasticdl.client.errors import JobNotFoundError

    try:
        backend.status(name)
    except JobNotFoundError:
        return False
    return True


# How long a job found locally waits for the configured cluster to say whether it has one too.
_AMBIGUITY_TIMEOUT_S = 5.0


def _holds_within(backend: JobBackend, name: str, timeout: float | None) -> bool:
    """:func:`_holds`, giving up (``TimeoutError``) after ``timeout`` seconds (None: none)."""
    if timeout is None:
        return _holds(backend, name)
    import threading

    result: list = []
    answered = threading.Event()

    def ask() -> None:
        try:
            result.append(_holds(backend, name))
        except Exception as e:  # reported to the caller below
            result.append(e)
        answered.set()

    # A daemon thread: one stuck in a connect does not keep the client from exiting.
    threading.Thread(target=ask, name="job-lookup", daemon=True).start()
    if not answered.wait(timeout):
        raise TimeoutError(f"no answer within {timeout:g}s")
    if isinstance(result[0], Exception):
        raise result[0]
    return bool(result[0])


def backend_for_job(
    name: str,
    platform: str | None = None,
    namespace: str | None = None,
    kube_context: str | None = None,
) -> JobBackend:
    """The backend holding job ``name``: the ``platform`` given; else the job is looked up by
    name, in the local job directories first, then in the configured cluster's namespace
    (:func:`_cluster_configured`). One line (``ClientError``) when it is in both (which one
    is meant?) or in neither."""
    from elasticdl.client.errors import JobNotFoundError

    if platform or _job_server_configured():
        return backend_for_target(platform, namespace, kube_context)
    local, cluster, ns = _lookup_target(namespace, kube_context)
    in_local = _holds(local, name)
    if cluster is None or not in_local and not _valid_job_name(name):
        if not in_local:
            local.status(name)  # raises the local backend's one line (names the directory)
        return local
    try:
        # Found here, the cluster only decides whether the name is ambiguous: a cluster that
        # does not answer in time (an unreachable address) must not hold up a local job.
        in_cluster_ns = _holds_within(cluster, name, _AMBIGUITY_TIMEOUT_S if in_local else None)
    except Exception as e:  # unreachable, misconfigured, no answer in time
        if in_local:
            return local
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ClientError(
            f"no local job named {name!r}, and Kubernetes namespace {ns} could not be asked "
            f"({reason}); pass --platform=local or fix the cluster access"
        ) from None
    if in_local and in_cluster_ns:
        raise ClientError(
            f"job {name!r} exists both locally and in Kubernetes namespace {ns}; pass "
            "--platform=local or --platform=kubernetes"
        )
    if in_local:
        return local
    if in_cluster_ns:
        return cluster
    raise JobNotFoundError(
        f"no local job named {name!r} and none in Kubernetes namespace {ns}; see 'elasticdl list'"
    )


def jobs_everywhere(
    platform: str | None = None, namespace: str | None = None, kube_context: str | None = None
) -> tuple[list[JobStatus], list[str]]:
    """``elasticdl list``: the jobs of ``platform``, or without one those of this machine and
    of the configured cluster, oldest first; plus warnings (a cluster that cannot be asked)."""
    if platform or _job_server_configured():
        return backend_for_target(platform, namespace, kube_context).list_jobs(), []
    local, cluster, ns = _lookup_target(namespace, kube_context)
    jobs, warnings = local.list_jobs(), []
    if cluster is not None:
        try:
            jobs += cluster.list_jobs()
        except Exception as e:  # unreachable or misconfigured: the local jobs still count
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            warnings.append(f"jobs of Kubernetes namespace {ns} are not listed: {reason}")
    return sorted(jobs, key=lambda s: s.created_at or 0), warnings
