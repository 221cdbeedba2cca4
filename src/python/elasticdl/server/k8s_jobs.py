"""Jobs of a server on Kubernetes: master pods in one namespace, each labelled with its owner.

The label is the owner record, kept by the cluster: a restarted server (or a second replica
of it) finds every job and its owner from the pods alone. A user reaches only pods with their
own label; another user's job is "not found", exactly like a job that does not exist.

A job's status lists its master pod among the replicas (first, as ``master``): on Kubernetes
the master is a pod that can fail, be evicted and (a restartable master) be started again, and
the dashboard shows it beside the PS and workers the master publishes.
"""

from __future__ import annotations

from elasticdl.common.job_status import JobStatus, ReplicaStatus
from elasticdl.jobs.errors import ClientError, JobNotFoundError
from elasticdl.jobs.k8s_backend import KubernetesBackend
from elasticdl.jobs.k8s_status import current_masters
from elasticdl.k8s.client import K8sApiError
from elasticdl.k8s.names import MASTER_TYPE, job_selector, masters_selector
from elasticdl.k8s.pod_logs import PodLogs
from elasticdl.k8s.termination import read_termination

OWNER_LABEL = "elasticdl-owner"


class OwnedKubernetesBackend(KubernetesBackend):
    """``KubernetesBackend`` seen by one user of the server."""

    def __init__(
        self,
        owner: str,
        namespace: str,
        kube_context: str = "",
        pod_logs: PodLogs | None = None,
    ) -> None:
        super().__init__(namespace=namespace, kube_context=kube_context, pod_logs=pod_logs)
        self.owner = owner

    def build_master_pod(self, job, service_account: str = ""):
        pod = super().build_master_pod(job, service_account)
        pod.metadata.labels = {**(pod.metadata.labels or {}), OWNER_LABEL: self.owner}
        return pod

    def _master(self, name: str):
        # status, logs and cancel all find the job through its master pod.
        pod = super()._master(name)
        if (pod.metadata.labels or {}).get(OWNER_LABEL) != self.owner:
            raise JobNotFoundError(f"no job named {name!r}")
        return pod

    def status(self, name: str) -> JobStatus:
        status = super().status(name)
        status.replicas = [self._master_replica(name), *status.replicas]
        return status

    def _master_replica(self, name: str) -> ReplicaStatus:
        try:
            pods = self.k8s.list_pods(job_selector(name, MASTER_TYPE))
        except K8sApiError as e:
            raise ClientError(str(e)) from None
        return master_replica(pods or [self._master(name)])

    def list_jobs(self) -> list[JobStatus]:
        masters = self.k8s.list_pods(f"{masters_selector()},{OWNER_LABEL}={self.owner}")
        return sorted(
            (self._status_of(p) for p in current_masters(masters)),
            key=lambda s: s.created_at or 0,
        )


def master_replica(pods: list) -> ReplicaStatus:
    """The replica row of a job's master, from all its master pods: the current one's phase,
    exit code and reason; as restarts, the earlier master pods a restartable master's Job left
    behind (one per master that died)."""
    reading = read_termination(current_masters(pods)[0])
    return ReplicaStatus(
        name=MASTER_TYPE,
        type=MASTER_TYPE,
        phase=reading.phase,
        exit_code=reading.exit_code,
        restarts=len(pods) - 1,
        message=reading.reason,
    )
