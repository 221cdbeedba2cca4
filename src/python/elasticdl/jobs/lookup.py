"""Jobs where no platform is named: this machine's and the configured cluster's.

A job is looked up by name in the local job directories first, then in the configured
cluster's namespace (the config file names the platform or a context, or credentials exist:
``$KUBECONFIG``, ``~/.kube/config``, a pod's service account). A name in both is refused
(which one is meant?); ``list`` shows both, and a cluster that cannot be asked only leaves its
jobs out. A submitted spec goes to its own (resolved) platform.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Callable, Iterator, TypeVar

from elasticdl.common.job_spec import MAX_JOB_NAME_LENGTH, JobSpec
from elasticdl.common.job_status import JobStatus
from elasticdl.common.types import PlatformName
from elasticdl.jobs.backend import JobBackend, JobHandle, Progress
from elasticdl.jobs.errors import ClientError, JobNotFoundError
from elasticdl.jobs.platforms import platform_backend

T = TypeVar("T")

# How long a job found locally waits for the configured cluster to say whether it has one too.
AMBIGUITY_TIMEOUT_S = 5.0


def cluster_configured(platform: str, kube_context: str) -> bool:
    """Whether commands that look a job up should also ask a Kubernetes cluster."""
    from elasticdl.k8s.client import in_cluster

    if platform == PlatformName.KUBERNETES or kube_context:
        return True
    kubeconfig = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    return bool(kubeconfig) or os.path.exists(os.path.expanduser("~/.kube/config")) or in_cluster()


def _valid_job_name(name: str) -> bool:
    return bool(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)) and (
        len(name) <= MAX_JOB_NAME_LENGTH
    )


def _holds(backend: JobBackend, name: str) -> bool:
    try:
        backend.status(name)
    except JobNotFoundError:
        return False
    return True


def _answer_within(ask: Callable[[], T], timeout: float | None) -> T:
    """``ask()``, giving up (``TimeoutError``) after ``timeout`` seconds (None: none)."""
    if timeout is None:
        return ask()
    result: list = []
    answered = threading.Event()

    def run() -> None:
        try:
            result.append(ask())
        except Exception as e:  # reported to the caller below
            result.append(e)
        answered.set()

    # A daemon thread: one stuck in a connect does not keep the client from exiting.
    threading.Thread(target=run, name="job-lookup", daemon=True).start()
    if not answered.wait(timeout):
        raise TimeoutError(f"no answer within {timeout:g}s")
    if isinstance(result[0], Exception):
        raise result[0]
    return result[0]


def _reason(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


class JobLookup(JobBackend):
    """This machine's jobs and the configured cluster's (see the module docstring).
    ``platform``/``namespace``/``kube_context``: the config file's (what decides whether and
    where the cluster is asked)."""

    platform = ""

    def __init__(self, platform: str = "", namespace: str = "", kube_context: str = "") -> None:
        self.namespace = namespace or "default"
        self._platform = platform or ""
        self._kube_context = kube_context or ""
        self.local = platform_backend(PlatformName.LOCAL)
        self._cluster: JobBackend | None = None
        self._cluster_known = False
        self._warnings: list[str] = []

    @property
    def cluster(self) -> JobBackend | None:
        """The configured cluster's backend, or None (none configured, or no Kubernetes SDK
        in this installation: local jobs only)."""
        if not self._cluster_known:
            self._cluster_known = True
            if cluster_configured(self._platform, self._kube_context):
                try:
                    self._cluster = platform_backend(
                        PlatformName.KUBERNETES, self.namespace, self._kube_context
                    )
                except ClientError:
                    if self._platform == PlatformName.KUBERNETES:
                        raise
        return self._cluster

    # ---- submit: the spec's platform -----------------------------------------------------
    def submit(
        self,
        spec: JobSpec,
        yaml_path: str = "",
        package_path: str = "",
        progress: Progress | None = None,
    ) -> JobHandle:
        backend = platform_backend(spec.platform, spec.namespace, spec.kube_context)
        return backend.submit(spec, yaml_path, package_path, progress)

    # ---- a job by name -------------------------------------------------------------------
    def holding(self, name: str) -> JobBackend:
        """The backend holding job ``name``; one line (``ClientError``) when it is in both
        places or in neither."""
        local = self.local
        in_local = _holds(local, name)
        cluster = self.cluster
        if cluster is None or not in_local and not _valid_job_name(name):
            if not in_local:
                local.status(name)  # raises the local backend's one line (names the directory)
            return local
        ns = self.namespace
        try:
            # Found here, the cluster only decides whether the name is ambiguous: a cluster
            # that does not answer in time (an unreachable address) must not hold up a local
            # job.
            timeout = AMBIGUITY_TIMEOUT_S if in_local else None
            in_cluster_ns = _answer_within(lambda: _holds(cluster, name), timeout)
        except Exception as e:  # unreachable, misconfigured, no answer in time
            if in_local:
                return local
            raise ClientError(
                f"no local job named {name!r}, and Kubernetes namespace {ns} could not be asked "
                f"({_reason(e)}); pass --platform=local or fix the cluster access"
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
            f"no local job named {name!r} and none in Kubernetes namespace {ns}; "
            "see 'elasticdl list'"
        )

    def status(self, name: str) -> JobStatus:
        return self.holding(name).status(name)

    def logs(self, name: str, replica: str = "master", follow: bool = False) -> Iterator[str]:
        return self.holding(name).logs(name, replica, follow)

    def cancel(self, name: str) -> JobStatus:
        return self.holding(name).cancel(name)

    def scale_ps(self, name: str, num_ps: int, timeout: float | None = None) -> str:
        return self.holding(name).scale_ps(name, num_ps, timeout=timeout)

    def wait(
        self, name: str, timeout: float | None = None, poll_interval: float = 1.0
    ) -> JobStatus:
        return self.holding(name).wait(name, timeout=timeout, poll_interval=poll_interval)

    # ---- all jobs ------------------------------------------------------------------------
    def list_jobs(self) -> list[JobStatus]:
        jobs, self._warnings = self.local.list_jobs(), []
        cluster = self.cluster
        if cluster is not None:
            try:
                jobs += cluster.list_jobs()
            except Exception as e:  # unreachable or misconfigured: the local jobs still count
                self._warnings.append(
                    f"jobs of Kubernetes namespace {self.namespace} are not listed: {_reason(e)}"
                )
        return sorted(jobs, key=lambda s: s.created_at or 0)

    @property
    def warnings(self) -> list[str]:
        return list(self._warnings)
