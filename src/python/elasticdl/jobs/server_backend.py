"""Jobs run by a job server (``server:`` in the config file): the server completes, checks
and runs the spec; ``submit`` uploads the model zoo first (``package_path``, default the
spec's ``model_zoo``), and the spec's data and output paths are paths in the user's data
directory there."""

from __future__ import annotations

import time
from typing import Any, Iterator, Mapping

from elasticdl.common.job_spec import JobSpec
from elasticdl.common.job_status import JobStatus
from elasticdl.common.spec_codec import SpecError
from elasticdl.jobs.backend import JobBackend, JobHandle, Progress
from elasticdl.jobs.config import ClientConfig
from elasticdl.jobs.given import command_for, given_spec
from elasticdl.jobs.server_client import JobServerClient


class ServerBackend(JobBackend):
    platform = "server"

    def __init__(self, client: JobServerClient) -> None:
        self.client = client

    def prepare(
        self, command: str | None, values: Mapping[str, Any], config: ClientConfig
    ) -> tuple[JobSpec, list[str]]:
        """Only what was given: the server completes the spec with what it decides."""
        return given_spec(command, values), []

    def submit(
        self,
        spec: JobSpec,
        yaml_path: str = "",
        package_path: str = "",
        progress: Progress | None = None,
    ) -> JobHandle:
        if yaml_path:
            raise SpecError(
                "--yaml writes a Kubernetes manifest; it cannot go through a job server"
            )
        status = self.client.submit_job(
            spec,
            package_dir=package_path or spec.model_zoo or ".",
            command=command_for(spec),
            progress=progress,
        )
        return JobHandle(
            job_name=status.job_name,
            platform=f"server:{status.platform}",
            created_at=status.created_at or time.time(),
            server=self.client.url,
        )

    def list_jobs(self) -> list[JobStatus]:
        return self.client.list_jobs()

    def status(self, name: str) -> JobStatus:
        return self.client.get_job_status(name)

    def logs(self, name: str, replica: str = "master", follow: bool = False) -> Iterator[str]:
        return self.client.tail_logs(name, replica, follow)

    def cancel(self, name: str) -> JobStatus:
        return self.client.stop_job(name)
