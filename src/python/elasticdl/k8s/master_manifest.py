"""The Kubernetes objects that run a job's master, built from a resolved job spec (no API
calls, so bad input creates nothing).

The master is ``python -m elasticdl.master.main <the job as one argument>`` in a pod built
like every pod of a job (:func:`elasticdl.k8s.pods.build_pod`).

A master whose journal outlives its pod (a job with ``--job_dir`` on a writable ``--volume``)
is restartable: its pod is the template of a batch/v1 Job ``elasticdl-<job>-master``
(``restartPolicy: Never``, ``backoffLimit`` :data:`MASTER_RESTARTS`) that creates a new master
pod whenever one fails, and the new master resumes the job from the journal. A Job rather than
a ReplicaSet: a ReplicaSet's pods must have ``restartPolicy: Always``, so a master that
finished the job would be started again, while a Job ends when its pod exits 0 and gives up
after ``backoffLimit`` failures, so a master that crashes at every start does not loop
forever. Without ``--job_dir`` the master is a bare pod: nothing outside it to resume from.
"""

from __future__ import annotations

import os

from elasticdl.common.job_spec import JobSpec, master_argv
from elasticdl.common.types import PlatformName
from elasticdl.k8s.cluster_spec import ClusterSpec
from elasticdl.k8s.names import MASTER_TYPE, master_pod_name

MASTER_MODULE = "elasticdl.master.main"
# How many times the Job starts a new master after one died (restartable masters only).
MASTER_RESTARTS = 6


def restartable(job: JobSpec) -> bool:
    """A master whose journal outlives its pod (``--job_dir`` on a volume) can be restarted."""
    return bool(job.job_dir)


def check_job_dir(job: JobSpec) -> None:
    """``--job_dir`` on Kubernetes must lie under a writable ``--volume`` mount: the journal
    a restarted master resumes from must outlive the master's pod. Raises ``ValueError``."""
    from elasticdl.common.job_spec.volumes import parse_volumes

    path = os.path.normpath(job.job_dir)
    hint = (
        "mount a volume there, e.g. --volume='claim_name=<pvc>,mount_path=/data' "
        "--job_dir=/data/jobs/<job>, or leave --job_dir out (a master that dies then ends the job)"
    )
    if not os.path.isabs(path):
        raise ValueError(f"--job_dir {job.job_dir!r} must be an absolute path in the pods; {hint}")
    volumes = parse_volumes(job.volume) if job.volume else []
    for volume in volumes:
        mount_path = os.path.normpath(volume.mount_path)
        inside = path == mount_path or path.startswith(mount_path.rstrip("/") + "/")
        if inside and not volume.read_only:
            return
    raise ValueError(f"--job_dir {job.job_dir!r} is on no writable --volume; {hint}")


def master_pod(job: JobSpec, namespace: str, service_account: str = ""):
    """The master pod of a resolved job spec in ``namespace``. Raises ``ValueError``."""
    from elasticdl.k8s.pods import PodTemplate, build_pod

    if not job.image_name:
        raise ValueError(
            "--image_name is required on Kubernetes; build one with 'elasticdl zoo build'"
        )
    cluster_spec = ClusterSpec.from_spec(job)
    template = PodTemplate.from_spec(job, cluster_spec=cluster_spec)
    template.namespace = namespace
    template.service_account = service_account
    # Never restarted in place: a restartable master's Job makes a new pod instead (each
    # life's exit code and log stay readable); a bare master pod is not restarted at all.
    template.restart_policy = "Never"
    if restartable(job):
        check_job_dir(job)
    # The whole job in one argument; only the fields that differ from their defaults, so the
    # manifest stays readable.
    sent = job.replace(platform=PlatformName.KUBERNETES, namespace=namespace)
    return build_pod(
        template,
        name=master_pod_name(job.job_name),
        job_name=job.job_name,
        replica_type=MASTER_TYPE,
        replica_id=0,
        image=job.image_name,
        command=["python", "-m", MASTER_MODULE, *master_argv(spec=sent)],
        resource_request=job.master_resource_request,
        resource_limit=job.master_resource_limit,
        priority_class=job.master_pod_priority,
        # A port a restartable master declares would, on the host network, be a host port its
        # dead predecessor's pod still holds for the scheduler: the next master would never
        # be scheduled. It listens all the same.
        port=None if restartable(job) else job.port,
    )


def master_job(pod, job: JobSpec, namespace: str):
    """The batch/v1 Job whose pod template is the master pod ``pod`` (restartable)."""
    from kubernetes import client

    return client.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=client.V1ObjectMeta(
            name=master_pod_name(job.job_name),
            namespace=namespace,
            labels=dict(pod.metadata.labels or {}),
        ),
        spec=client.V1JobSpec(
            backoff_limit=MASTER_RESTARTS,
            completions=1,
            parallelism=1,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(
                    labels=dict(pod.metadata.labels or {}),
                    annotations=pod.metadata.annotations,
                ),
                spec=pod.spec,
            ),
        ),
    )
