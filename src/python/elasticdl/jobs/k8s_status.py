"""A Kubernetes job's status, read from its pods: the master pod's phase, the ``status``
label the master sets when it ends, the progress it publishes in the ``elasticdl-status``
annotation, and the replica pods. Exit codes and causes come from
:func:`elasticdl.k8s.termination.read_termination`, the reading the master's platform acts on,
so ``elasticdl status`` tells what the master saw. No API calls here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Callable

from elasticdl.common.job_status import JobStatus, ReplicaStatus
from elasticdl.common.types import JobPhase, PlatformName
from elasticdl.k8s.names import (
    LABEL_JOB,
    LABEL_REPLICA_INDEX,
    LABEL_REPLICA_TYPE,
    LABEL_STATUS,
    STATUS_ANNOTATION,
)
from elasticdl.k8s.termination import (
    DELETED,
    REASON_DELETED,
    TERMINAL_PHASES,
    PodTermination,
    read_termination,
)

logger = logging.getLogger(__name__)

FINAL_LABELS = {JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED}


def created_at(obj) -> float | None:
    stamp = obj.metadata.creation_timestamp
    return stamp.timestamp() if stamp else None


def master_status(
    master, namespace: str, restarting: Callable[[], bool] = lambda: False
) -> JobStatus:
    """The job's status as its master pod shows it. ``restarting()``: whether the pod's Job
    starts a new master (a restartable master that died is not the end of the job); asked
    only about a dead master."""
    labels = master.metadata.labels or {}
    published: dict = {}
    raw = (master.metadata.annotations or {}).get(STATUS_ANNOTATION)
    if raw:
        try:
            published = json.loads(raw)
        except ValueError:
            logger.warning(
                "ignoring malformed %s annotation on %s", STATUS_ANNOTATION, master.metadata.name
            )
    reading = read_termination(master)
    phase = job_phase(labels.get(LABEL_STATUS, ""), reading.phase, published.get("phase", ""))
    message = published.get("message", "") or ""
    if phase == JobPhase.FAILED and not labels.get(LABEL_STATUS) and restarting():
        phase = JobPhase.RUNNING
        message = (
            f"the master pod {master.metadata.name} died ({master_failure(reading)}); "
            "its Job starts a new master, which resumes the job"
        )
    if phase == JobPhase.FAILED and not message:
        message = master_failure(reading)
    return JobStatus.from_dict(
        published,
        job_name=labels.get(LABEL_JOB) or master.metadata.name,
        platform=PlatformName.KUBERNETES,
        phase=phase,
        message=message,
        namespace=namespace,
        created_at=created_at(master),
    )


def job_phase(label: str, pod_phase: str | None, published: str) -> str:
    if label in FINAL_LABELS:
        return label
    if pod_phase == "Succeeded":
        # A restartable master exits 0 also when the job failed (so its Job does not start it
        # again); its published phase says how the job ended when its label could not.
        return published if published in FINAL_LABELS else JobPhase.SUCCEEDED
    if pod_phase == "Failed":
        return JobPhase.FAILED
    if pod_phase == "Running":
        return published if published in (JobPhase.RUNNING, JobPhase.PENDING) else JobPhase.RUNNING
    return JobPhase.PENDING


def master_failure(reading: PodTermination) -> str:
    """Why the master pod failed, for a master that could not say so itself."""
    if reading.exit_code is not None:
        cause = f" ({reading.reason})" if reading.reason else ""
        return f"master exited with {reading.exit_code}{cause}"
    return ": ".join(part for part in (reading.reason, reading.message) if part)


def master_job_name(master) -> str:
    """The name of the Job that runs this master pod (a restartable master), or ""."""
    for ref in master.metadata.owner_references or []:
        if ref.kind == "Job" and ref.controller:
            return ref.name
    return ""


def current_master(pods: list):
    """Of one job's master pods (a restartable master leaves its dead lives behind), the
    newest live one, else the newest; None without any."""
    if not pods:
        return None

    def key(pod):
        return (not read_termination(pod).is_terminal, created_at(pod) or 0)

    return max(pods, key=key)


def current_masters(pods: list) -> list:
    """One master pod per job (:func:`current_master`) of the master pods ``pods``."""
    by_job: dict[str, list] = {}
    for pod in pods:
        job = (pod.metadata.labels or {}).get(LABEL_JOB, pod.metadata.name)
        by_job.setdefault(job, []).append(pod)
    return [current_master(group) for group in by_job.values()]


def replica_of_pod(pod) -> ReplicaStatus | None:
    labels = pod.metadata.labels or {}
    try:
        replica_id = int(labels.get(LABEL_REPLICA_INDEX, "0"))
    except ValueError:
        return None
    reading = read_termination(pod)
    rtype = labels.get(LABEL_REPLICA_TYPE, "")
    return ReplicaStatus(
        name=f"{rtype}-{replica_id}",
        type=rtype,
        id=replica_id,
        phase=reading.phase,
        exit_code=reading.exit_code,
        message=reading.reason,
    )


def replicas_of_pods(pods: list) -> list[ReplicaStatus]:
    """The replicas of ``pods`` (PS and workers), in (type, id) order."""
    replicas = (replica_of_pod(p) for p in pods)
    return sorted((r for r in replicas if r is not None), key=lambda r: (r.type, r.id))


def settle_replicas(
    published: list[ReplicaStatus], pods: list, job_final: bool
) -> list[ReplicaStatus]:
    """The replicas the master published (restarts, replacements: what only it knows), each
    that it still shows unfinished brought up to date with its pod. The master publishes every
    few seconds, and for the last time right after deleting the replicas left at the job's
    end, before their pods are gone: without this a finished job would show its PS running.
    An unfinished replica takes its pod's phase, exit code and reason once the pod ended; of
    a finished job, one whose pod is gone is Deleted."""
    live = {r.name: r for r in map(replica_of_pod, pods) if r is not None}
    settled = []
    for replica in published:
        if replica.phase not in TERMINAL_PHASES:
            pod = live.get(replica.name)
            if pod is not None and pod.phase in TERMINAL_PHASES:
                replica = dataclasses.replace(
                    replica, phase=pod.phase, exit_code=pod.exit_code, message=pod.message
                )
            elif pod is None and job_final:
                replica = dataclasses.replace(replica, phase=DELETED, message=REASON_DELETED)
        settled.append(replica)
    return settled
