"""One training job submitted through the CLI and polled through the client's backend until it
ends, timed from the submit: shared by the benchmarks that compare where a job runs
(``node_overhead.py``, ``pod_network.py``)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import cluster

POLL_S = 0.1


@dataclass
class JobTiming:
    """Seconds from the submit to the first trained task and to Succeeded, and the records per
    second trained after the first task (0 when the job ended with its first poll)."""

    first_task_s: float
    job_s: float
    records_per_s: float


def time_job(tool: str, backend, argv: list[str], name: str, timeout_s: float) -> JobTiming:
    """Submit ``elasticdl <argv> --job_name=<name> --detach`` and poll ``backend.status`` every
    ``POLL_S`` until the job ends; exits naming ``tool`` when it does not end within
    ``timeout_s`` or ends other than Succeeded with every record trained."""
    t0 = time.monotonic()
    cluster.cli(tool, *argv, f"--job_name={name}", "--detach")
    first = None
    while True:
        status = backend.status(name)
        if first is None and status.records_trained > 0:
            first = time.monotonic() - t0
            first_records = status.records_trained
        if status.phase in ("Succeeded", "Failed", "Cancelled"):
            break
        if time.monotonic() - t0 > timeout_s:
            sys.exit(f"{tool}: job {name} did not end in {timeout_s:g} s")
        time.sleep(POLL_S)
    total = time.monotonic() - t0
    if status.phase != "Succeeded" or status.records_trained != status.records_expected:
        sys.exit(f"{tool}: job {name} {status.phase}: {status.message}")
    if first is None:
        first, first_records = total, 0
    trained_after = status.records_trained - first_records
    return JobTiming(
        first_task_s=first,
        job_s=total,
        records_per_s=trained_after / (total - first) if total > first else 0.0,
    )
