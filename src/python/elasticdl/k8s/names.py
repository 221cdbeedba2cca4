"""Every name and label ElasticDL gives Kubernetes objects, in one place.

These strings are a contract: the client finds a job by its master pod's name, the master
finds and watches its replicas by their labels, services select pods by the same labels, and
users' dashboards and ``kubectl`` selectors rely on them. Change one only together with every
reader, and never for a running job.

A job ``<job>`` consists of

* the master pod ``elasticdl-<job>-master``;
* PS ``i``: pod ``elasticdl-<job>-ps-<i>`` and a headless service of the same name, reachable
  as ``elasticdl-<job>-ps-<i>.<namespace>.svc``;
* worker ``i``: pod ``elasticdl-<job>-worker-<i>`` (and a service of the same name only if it
  listens on a port);
* the NetworkPolicy ``elasticdl-<job>-ingress`` (ingress to the job's pods only from the job's
  pods) and the Secret ``elasticdl-<job>-secret`` (the job's secret).

Every one of them carries :func:`job_labels`. Plain strings only: the light client imports
this module without the ``kubernetes`` SDK.
"""

from __future__ import annotations

from elasticdl.common.types import ReplicaType, replica_name

NAME_PREFIX = "elasticdl"

# ---- labels ----------------------------------------------------------------------------------
APP_LABEL = "app"
APP_NAME = "elasticdl"
LABEL_JOB = "elasticdl-job-name"
LABEL_REPLICA_TYPE = "elasticdl-replica-type"
LABEL_REPLICA_INDEX = "elasticdl-replica-index"
# Set on the master pod when the job ends: "Succeeded", "Failed", "Cancelled" (see
# deploy/k8s/README.md for why the key is the bare word "status").
LABEL_STATUS = "status"
# The labels a user's cluster spec may not override: they identify the job's objects.
PROTECTED_LABELS = (LABEL_JOB, LABEL_REPLICA_TYPE, LABEL_REPLICA_INDEX)

# ---- annotations -----------------------------------------------------------------------------
# JSON status snapshot the master publishes on its pod (progress, replicas) for the client.
STATUS_ANNOTATION = "elasticdl-status"

# ---- replica types (values of LABEL_REPLICA_TYPE) --------------------------------------------
MASTER_TYPE = ReplicaType.MASTER.value
PS_TYPE = ReplicaType.PS.value
WORKER_TYPE = ReplicaType.WORKER.value
REPLICA_TYPES = (PS_TYPE, WORKER_TYPE)  # what the master creates

# ---- inside the pods -------------------------------------------------------------------------
CONTAINER_NAME = "main"  # the one container of every pod ElasticDL creates
PORT_NAME = "grpc"  # the container port and the service port of replicas that serve
# The ServiceAccount deploy/k8s/rbac.yaml creates; the master pod runs under it when present.
SERVICE_ACCOUNT = "elasticdl"
# Environment variables every pod gets from the downward API, and where they come from.
POD_IP_ENV = "MY_POD_IP"
# ELASTICDL_K8S_NETWORK=host (in --envs): every pod of the job runs with hostNetwork, and the
# replicas find each other at <pod IP>:<distinct port> (elasticdl.platform.kubernetes).
NETWORK_ENV = "ELASTICDL_K8S_NETWORK"
NETWORK_POD = "pod"
NETWORK_HOST = "host"
POD_NAME_ENV = "MY_POD_NAME"
POD_NAMESPACE_ENV = "MY_POD_NAMESPACE"
DOWNWARD_ENV = {
    POD_IP_ENV: "status.podIP",
    POD_NAME_ENV: "metadata.name",
    POD_NAMESPACE_ENV: "metadata.namespace",
}


# ---- object names ----------------------------------------------------------------------------
def master_pod_name(job_name: str) -> str:
    return f"{NAME_PREFIX}-{job_name}-{MASTER_TYPE}"


def pod_name(job_name: str, replica_type: str, replica_id: int) -> str:
    """``elasticdl-<job>-<type>-<id>``; also the name of the replica's headless service and,
    on the local platform, of its log file (one spelling: ``common.types.replica_name``)."""
    return replica_name(job_name, replica_type, replica_id)


def secret_name(job_name: str) -> str:
    """The Secret holding the job's secret; the master creates it, owned by its pod."""
    return f"{NAME_PREFIX}-{job_name}-secret"


def network_policy_name(job_name: str) -> str:
    """The NetworkPolicy admitting ingress to the job's pods from the job's pods only; the
    client creates it, owned by the master pod."""
    return f"{NAME_PREFIX}-{job_name}-ingress"


def service_host(job_name: str, replica_type: str, replica_id: int, namespace: str) -> str:
    """The DNS name of a replica's headless service; it survives relaunches of the replica."""
    return f"{pod_name(job_name, replica_type, replica_id)}.{namespace}.svc"


def volume_name(index: int) -> str:
    """Name of the ``index``-th pod volume built from ``--volume``."""
    return f"volume-{index}"


# ---- labels and selectors --------------------------------------------------------------------
def job_labels(job_name: str, replica_type: str, replica_id: int | None = None) -> dict[str, str]:
    labels = {APP_LABEL: APP_NAME, LABEL_JOB: job_name, LABEL_REPLICA_TYPE: str(replica_type)}
    if replica_id is not None:
        labels[LABEL_REPLICA_INDEX] = str(replica_id)
    return labels


def job_object_labels(job_name: str) -> dict[str, str]:
    """Labels of the job's objects that belong to no one replica (its NetworkPolicy)."""
    return {APP_LABEL: APP_NAME, LABEL_JOB: job_name}


def job_selector(job_name: str, replica_type: str | None = None) -> str:
    """Every object of the job, or only those of one replica type."""
    selector = f"{LABEL_JOB}={job_name}"
    if replica_type:
        selector += f",{LABEL_REPLICA_TYPE}={replica_type}"
    return selector


def replicas_selector(job_name: str) -> str:
    """The job's PS and workers (everything but the master)."""
    return f"{job_selector(job_name)},{LABEL_REPLICA_TYPE} in ({','.join(REPLICA_TYPES)})"


def masters_selector() -> str:
    """The master pods of all jobs in a namespace (one per job)."""
    return f"{LABEL_REPLICA_TYPE}={MASTER_TYPE}"
