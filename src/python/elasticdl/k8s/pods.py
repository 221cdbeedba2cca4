"""Builds the pod and service objects of an ElasticDL job (master, workers, PS).

Shared by the client (which creates the master pod) and the master's
:class:`~elasticdl.platform.kubernetes.KubernetesPlatform` (workers and PS), so every pod of a
job gets the same image policy, volumes, environment and cluster-specific additions.

Every pod:

* is named and labelled as :mod:`elasticdl.k8s.names` says (``elasticdl-<job>-<type>-<id>``,
  the master ``elasticdl-<job>-master``; :func:`~elasticdl.k8s.names.job_labels`);
* has one container ``main`` running ``python -m <module> <args>`` directly (no shell, so no
  quoting issues), restart policy from ``--restart_policy`` (default ``Never``: ElasticDL
  relaunches replicas itself);
* gets ``MY_POD_IP`` / ``MY_POD_NAME`` / ``MY_POD_NAMESPACE`` from the downward API, then the
  ``--envs`` variables, then the replica's own variables, then ``--secret_envs`` and the job's
  secret as ``secretKeyRef`` s (the kubelet reads them; their values are in no pod spec);
  with ``ELASTICDL_K8S_NETWORK=host`` among them the pod runs with ``hostNetwork``
  (one-node clusters);
* runs under the restricted securityContext of :mod:`elasticdl.k8s.security` (non-root,
  read-only root filesystem, writable ``/tmp``) unless ``--pod_security=none``;
* pulls its image with the job's ``--image_pull_secrets`` (``imagePullSecrets``), if any;
* carries resource requests/limits from ``elasticdl.k8s.resources`` (``gpu`` ->
  ``nvidia.com/gpu``; the limit defaults to the request), volumes from
  ``elasticdl.k8s.volumes``, an optional PriorityClass (``high``/``low`` are ElasticDL's:
  :mod:`elasticdl.k8s.priority_classes`), and an owner reference to the
  master pod for replicas (deleting the master deletes the job);
* tolerates a NotReady or unreachable node for ``--node_lost_timeout`` seconds (not
  Kubernetes' 300), and workers and PS prefer nodes where fewer of their kind run.

Services are headless (``clusterIP: None``) and select exactly one replica by its labels, so
a relaunched PS keeps its DNS name ``elasticdl-<job>-ps-<i>.<namespace>.svc``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from elasticdl.common.job_spec import JobSpec
from elasticdl.k8s import priority_classes, resources, security, volumes
from elasticdl.k8s.client import to_model
from elasticdl.k8s.cluster_spec import ClusterSpec
from elasticdl.k8s.names import (
    CONTAINER_NAME,
    DOWNWARD_ENV,
    MASTER_TYPE,
    NETWORK_ENV,
    NETWORK_HOST,
    PORT_NAME,
    job_labels,
)

# The taints the node controller puts on a node that stopped reporting (NoExecute).
NODE_LOST_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
HOSTNAME_TOPOLOGY_KEY = "kubernetes.io/hostname"


@dataclasses.dataclass
class PodTemplate:
    """Job-wide pod settings (from the job's flags)."""

    namespace: str = "default"
    image_pull_policy: str = "Always"
    restart_policy: str = "Never"
    volume: str = ""  # --volume string
    envs: dict[str, str] = dataclasses.field(default_factory=dict)  # --envs
    # --secret_envs: variable -> (Secret name, key), read by the kubelet (secretKeyRef).
    secret_envs: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    cluster_spec: ClusterSpec = dataclasses.field(default_factory=ClusterSpec)
    service_account: str = ""  # "" = the namespace's default service account
    pod_security: str = security.POD_SECURITY_RESTRICTED  # --pod_security
    # --image_pull_secrets: what the kubelet pulls a private registry's images with.
    image_pull_secrets: tuple[str, ...] = ()
    # --node_lost_timeout: seconds on a NotReady/unreachable node before eviction.
    node_lost_timeout: int = JobSpec.node_lost_timeout

    @classmethod
    def from_spec(cls, job: JobSpec, cluster_spec: ClusterSpec | None = None) -> "PodTemplate":
        """From the job's ``namespace``, ``image_pull_policy``, ``restart_policy``, ``volume``,
        ``envs``, ``secret_envs``, ``pod_security`` (and its cluster spec unless ``cluster_spec`` is given).
        """
        return cls(
            namespace=job.namespace or "default",
            image_pull_policy=job.image_pull_policy,
            restart_policy=job.restart_policy,
            volume=job.volume,
            envs=job.env_vars(),
            secret_envs=job.secret_env_refs(),
            cluster_spec=cluster_spec if cluster_spec is not None else ClusterSpec.from_spec(job),
            pod_security=job.pod_security,
            image_pull_secrets=tuple(job.pull_secret_names()),
            node_lost_timeout=job.node_lost_timeout,
        )


def resource_requirements(request: str, limit: str = ""):
    """``V1ResourceRequirements`` from resource strings; the limit defaults to the request."""
    from kubernetes import client

    requests = resources.parse_resource(request)
    limits = resources.parse_resource(limit) if limit else dict(requests)
    if not requests and not limits:
        return None
    return client.V1ResourceRequirements(requests=requests or None, limits=limits or None)


def build_pod(
    template: PodTemplate,
    *,
    name: str,
    job_name: str,
    replica_type: str,
    replica_id: int | None,
    image: str,
    command: list[str],
    env: dict[str, str] | None = None,
    resource_request: str = "",
    resource_limit: str = "",
    priority_class: str = "",
    owner_reference: Any = None,
    port: int | None = None,
    secret_env: dict[str, tuple[str, str]] | None = None,
):
    """The ``V1Pod`` of one replica (or of the master, ``replica_type="master"``), with the
    cluster spec applied. ``secret_env``: variable -> (Secret name, key), read by the kubelet
    from that Secret (``secretKeyRef``), so the value is not in the pod spec."""
    from kubernetes import client

    env_vars = [
        client.V1EnvVar(
            name=key,
            value_from=client.V1EnvVarSource(
                field_ref=client.V1ObjectFieldSelector(field_path=path)
            ),
        )
        for key, path in DOWNWARD_ENV.items()
    ]
    # A variable from a Secret is never also given as plain text (e.g. copied from the
    # master's environment by --populate_env_names).
    secret_names = set(template.secret_envs) | set(secret_env or {})
    merged = {k: v for k, v in {**template.envs, **(env or {})}.items() if k not in secret_names}
    env_vars = [e for e in env_vars if e.name not in merged]
    env_vars += [client.V1EnvVar(name=k, value=str(v)) for k, v in merged.items()]
    env_vars += [
        client.V1EnvVar(
            name=var,
            value_from=client.V1EnvVarSource(
                secret_key_ref=client.V1SecretKeySelector(name=secret, key=key)
            ),
        )
        for var, (secret, key) in {**template.secret_envs, **(secret_env or {})}.items()
    ]

    pod_volumes, mounts = (
        volumes.volumes_and_mounts(template.volume) if template.volume else ([], [])
    )
    pod_volumes = [to_model(v.to_dict(), "V1Volume") for v in pod_volumes]
    mounts = [to_model(m.to_dict(), "V1VolumeMount") for m in mounts]
    if security.restricted(template.pod_security):
        # A read-only root filesystem: /tmp (and HOME) on a pod-private emptyDir instead.
        if all(m.mount_path != security.TMP_PATH for m in mounts):
            pod_volumes.append(
                client.V1Volume(name=security.TMP_VOLUME, empty_dir=client.V1EmptyDirVolumeSource())
            )
            mounts.append(
                client.V1VolumeMount(name=security.TMP_VOLUME, mount_path=security.TMP_PATH)
            )
        if security.HOME_ENV not in merged:
            env_vars.append(client.V1EnvVar(name=security.HOME_ENV, value=security.TMP_PATH))
    container = client.V1Container(
        name=CONTAINER_NAME,
        image=image,
        image_pull_policy=template.image_pull_policy,
        command=list(command),
        env=env_vars,
        resources=resource_requirements(resource_request, resource_limit),
        volume_mounts=mounts or None,
        ports=[client.V1ContainerPort(container_port=int(port), name=PORT_NAME)] if port else None,
        security_context=security.container_security_context(template.pod_security),
    )
    pod = client.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=client.V1ObjectMeta(
            name=name,
            namespace=template.namespace,
            labels=job_labels(job_name, replica_type, replica_id),
            owner_references=[owner_reference] if owner_reference is not None else None,
        ),
        spec=client.V1PodSpec(
            containers=[container],
            restart_policy=template.restart_policy,
            priority_class_name=priority_classes.class_name(priority_class) or None,
            volumes=pod_volumes or None,
            security_context=security.pod_security_context(template.pod_security),
            service_account_name=template.service_account or None,
            image_pull_secrets=[
                client.V1LocalObjectReference(name=secret) for secret in template.image_pull_secrets
            ]
            or None,
            # Only the master talks to the API server; its replicas get no credentials for it.
            automount_service_account_token=False if replica_type != MASTER_TYPE else None,
            # host network mode: the pods of the job share the node's network namespace.
            host_network=True if merged.get(NETWORK_ENV) == NETWORK_HOST else None,
            tolerations=node_lost_tolerations(template.node_lost_timeout),
            topology_spread_constraints=(
                None if replica_type == MASTER_TYPE else spread_over_nodes(job_name, replica_type)
            ),
        ),
    )
    return template.cluster_spec.patch_pod(pod, replica_type)


def node_lost_tolerations(seconds: int) -> list:
    """How long a pod stays on a node the node controller marked NotReady or unreachable.
    Kubernetes gives every pod 300 s; a job's pods get ``seconds``, so a dead machine holds
    the job up for about that long (plus the node monitor's grace period) before its workers
    and PS are relaunched elsewhere, instead of five minutes."""
    from kubernetes import client

    return [
        client.V1Toleration(
            key=taint, operator="Exists", effect="NoExecute", toleration_seconds=int(seconds)
        )
        for taint in NODE_LOST_TAINTS
    ]


def spread_over_nodes(job_name: str, replica_type: str) -> list:
    """A preference, never a requirement, to put a job's workers (and its PS) on different
    nodes: one lost node then takes a share of them rather than all, and co-located replicas
    do not compete for one node's CPUs and network. ``ScheduleAnyway``: a replica that only
    fits where others of its kind already run is still scheduled, as an elastic job must be."""
    from kubernetes import client

    return [
        client.V1TopologySpreadConstraint(
            max_skew=1,
            topology_key=HOSTNAME_TOPOLOGY_KEY,
            when_unsatisfiable="ScheduleAnyway",
            label_selector=client.V1LabelSelector(match_labels=job_labels(job_name, replica_type)),
        )
    ]


def build_service(
    template: PodTemplate,
    *,
    name: str,
    job_name: str,
    replica_type: str,
    replica_id: int,
    port: int,
    owner_reference: Any = None,
    publish_not_ready: bool = True,
):
    """Headless service selecting exactly the replica ``replica_type``/``replica_id``.

    ``publish_not_ready``: its pod's address is published before the pod is ready (a
    restarting PS must be resolvable, or workers cannot reconnect). Not for a pod that a Job
    replaces (the master's): Kubernetes up to 1.21 then keeps the failed pod's address in
    the Service beside its replacement's."""
    from kubernetes import client

    labels = job_labels(job_name, replica_type, replica_id)
    service = client.V1Service(
        api_version="v1",
        kind="Service",
        metadata=client.V1ObjectMeta(
            name=name,
            namespace=template.namespace,
            labels=dict(labels),
            owner_references=[owner_reference] if owner_reference is not None else None,
        ),
        spec=client.V1ServiceSpec(
            cluster_ip="None",
            selector=labels,
            ports=[client.V1ServicePort(name=PORT_NAME, port=int(port), target_port=int(port))],
            publish_not_ready_addresses=publish_not_ready,
        ),
    )
    return template.cluster_spec.patch_service(service)
