"""Which backend a command talks to: the one decision of where jobs go and where a job is
(the CLI and ``elasticdl.api`` both ask :func:`backend_for`).

1. A job server in the config file (``server:``), unless a platform is named: it runs and
   knows every job of its user.
2. A named platform (``--platform``): its backend, in the namespace and context given, else
   the config file's.
3. Neither: :class:`~elasticdl.jobs.lookup.JobLookup`, this machine's jobs and the configured
   cluster's; a submitted spec goes to its own resolved platform.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from elasticdl.jobs.backend import JobBackend
from elasticdl.jobs.config import ClientConfig, load_config
from elasticdl.jobs.errors import NoJobServerError

if TYPE_CHECKING:
    from elasticdl.jobs.server_client import JobServerClient


def job_server(config: ClientConfig | None = None) -> "JobServerClient | None":
    """The client of the job server the config file names, or None."""
    config = config if config is not None else load_config()
    if config.server is None:
        return None
    from elasticdl.jobs.server_client import JobServerClient

    return JobServerClient.from_config(config)


def required_job_server(what: str, config: ClientConfig | None = None) -> "JobServerClient":
    """The configured job server's client; ``NoJobServerError`` naming ``what`` without one."""
    client = job_server(config)
    if client is None:
        raise NoJobServerError(
            f"{what} needs a job server; add 'server: {{url: ..., token: ...}}' to the config file"
        )
    return client


def backend_for(
    platform: str | None = None,
    namespace: str | None = None,
    kube_context: str | None = None,
    *,
    config: ClientConfig | None = None,
) -> JobBackend:
    """The backend of the jobs a command means (see the module docstring); what is not given
    comes from ``config`` (default: the config file)."""
    config = config if config is not None else load_config()
    if not platform:
        server = job_server(config)
        if server is not None:
            from elasticdl.jobs.server_backend import ServerBackend

            return ServerBackend(server)
    namespace = namespace or config.namespace or "default"
    kube_context = kube_context or config.kube_context or ""
    if platform:
        from elasticdl.jobs.platforms import platform_backend

        return platform_backend(platform, namespace, kube_context)
    from elasticdl.jobs.lookup import JobLookup

    return JobLookup(config.platform or "", namespace, kube_context)
