"""Jobs managed through a job server: the ``JobBackend`` of ``list/status/logs/wait/cancel``
when the config file names a server (``server:``). Submitting needs the model zoo uploaded
first, so it goes through :meth:`JobServerClient.submit_job` instead of :meth:`submit`."""

from __future__ import annotations

import time
from typing import Iterator

from elasticdl.client.backend import JobBackend, JobHandle
from elasticdl.client.server_client import JobServerClient
from elasticdl.common.job_spec import JobSpec
from elasticdl.common.job_status import JobStatus


class ServerBackend(JobBackend):
    platform = "server"

    def __init__(self, client: JobServerClient) -> None:
        self.client = client

    def submit(self, spec: JobSpec, yaml_path: str = "") -> JobHandle:
        command = {"evaluation_only": "evaluate", "prediction_only": "predict"}.get(
            str(getattr(spec.job_type, "value", spec.job_type) or ""), "train"
        )
        status = self.client.submit_job(spec, package_dir=spec.model_zoo or ".", command=command)
        return handle_of(status)

    def list_jobs(self) -> list[JobStatus]:
        return self.client.list_jobs()

    def status(self, name: str) -> JobStatus:
        return self.client.get_job_status(name)

    def logs(self, name: str, replica: str = "master", follow: bool = False) -> Iterator[str]:
        return self.client.tail_logs(name, replica, follow)

    def cancel(self, name: str) -> JobStatus:
        return self.client.stop_job(name)


def handle_of(status: JobStatus) -> JobHandle:
    return JobHandle(
        job_name=status.job_name,
        platform=f"server:{status.platform}",
        created_at=status.created_at or time.time(),
    )
