"""The interface every job backend implements, and the wait every backend shares.

A backend owns the lifecycle of jobs in one place: ``LocalBackend`` (process trees on this
machine, the default), ``KubernetesBackend`` (a master pod plus the pods it creates),
``ServerBackend`` (a job server runs them) and ``JobLookup`` (this machine's jobs and the
configured cluster's, found by name). :func:`elasticdl.jobs.routing.backend_for` picks one;
the CLI and ``elasticdl.api`` only talk to this interface, so every command works the same
everywhere.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from elasticdl.common.job_status import JobStatus
from elasticdl.jobs.errors import ClientError, WaitTimeout

if TYPE_CHECKING:
    from elasticdl.common.job_spec import JobSpec
    from elasticdl.jobs.config import ClientConfig

# progress(bytes done, bytes in all, the file's name): uploads to a job server
Progress = Callable[[int, int, str], None]


@dataclasses.dataclass
class JobHandle:
    """What ``submit`` returns: enough to find the job again."""

    job_name: str
    platform: str
    created_at: float
    namespace: str = ""
    kube_context: str = ""  # Kubernetes: the kubeconfig context the job was submitted with
    job_dir: str = ""  # local platform
    pid: int | None = None  # local platform: the master's process (group leader)
    master: str = ""  # Kubernetes: the master pod name
    yaml_path: str = ""  # Kubernetes with --yaml: the manifest written (nothing submitted)
    server: str = ""  # the URL of the job server that runs the job
    notices: list[str] = dataclasses.field(default_factory=list)  # what resolving decided


class JobBackend(abc.ABC):
    """Lifecycle of ElasticDL jobs in one place. Methods raise ``ValueError`` subclasses
    (see ``elasticdl.jobs.errors``) for user errors such as an unknown job name."""

    platform: str = ""

    def prepare(
        self, command: str | None, values: Mapping[str, Any], config: "ClientConfig"
    ) -> tuple["JobSpec", list[str]]:
        """The spec :meth:`submit` takes, from what a user gave (typed values of ``command``;
        no command: the values of a whole spec), and notices about what was decided: the
        values completed from ``config``, resolved and checked, local inputs included. Raises
        ``ValueError`` subclasses; nothing is created."""
        from elasticdl.jobs.given import resolved_spec

        return resolved_spec(command, values, config)

    @abc.abstractmethod
    def submit(
        self,
        spec: "JobSpec",
        yaml_path: str = "",
        package_path: str = "",
        progress: Progress | None = None,
    ) -> JobHandle:
        """Start the job of a spec from :meth:`prepare`. ``yaml_path``: only write the job's
        manifest there (platforms that have one); ``package_path``: the model-zoo directory
        a job server runs (``progress`` reports its upload)."""

    @abc.abstractmethod
    def list_jobs(self) -> list[JobStatus]:
        """All jobs this backend knows, oldest first."""

    @property
    def warnings(self) -> list[str]:
        """What the last :meth:`list_jobs` left out, and why (a cluster that cannot be asked)."""
        return []

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

    def scale_ps(self, name: str, num_ps: int, timeout: float | None = None) -> str:
        """Change a running job's PS count to ``num_ps``; returns the master's one line
        (waiting at most ``timeout`` seconds for it; None: the backend's default)."""
        raise ClientError(
            f"scale-ps cannot reach the masters of {self.platform} jobs; use it on local or "
            "Kubernetes jobs"
        )

    def wait(
        self, name: str, timeout: float | None = None, poll_interval: float = 1.0
    ) -> JobStatus:
        """Block until the job reaches a final phase; raises ``WaitTimeout`` after ``timeout``
        seconds (None: no limit)."""
        return wait_until_final(self.status, name, timeout, poll_interval)


def refuse_package_path(package_path: str) -> None:
    """A backend that runs jobs itself has no use for a package to upload."""
    if package_path:
        raise ClientError(
            "--package_path is what a job server runs; configure one (server: in the config "
            "file) or use --model_zoo"
        )


def wait_until_final(
    read_status: Callable[[str], JobStatus],
    name: str,
    timeout: float | None,
    poll_interval: float,
) -> JobStatus:
    """Poll ``read_status(name)`` until the job is in a final phase; ``WaitTimeout`` after
    ``timeout`` seconds."""
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
