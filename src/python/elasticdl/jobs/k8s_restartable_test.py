"""The client's side of a restartable master on Kubernetes, without a cluster: the
master's batch/v1 Job, the ``--job_dir`` check, and how a job's state is read from master pods
of several lives. The cluster side is tests/python/elasticdl_tests/k8s/master_restart_test.py."""

from __future__ import annotations

import datetime

import pytest

pytest.importorskip("kubernetes")

from elasticdl.common.job_spec import JobSpec  # noqa: E402
from elasticdl.jobs.errors import ClientError  # noqa: E402
from elasticdl.jobs.k8s_backend import KubernetesBackend  # noqa: E402
from elasticdl.jobs.k8s_status import current_masters, job_phase  # noqa: E402
from elasticdl.k8s.master_manifest import MASTER_RESTARTS  # noqa: E402


def _job(**kwargs) -> JobSpec:
    fields = dict(
        job_name="j",
        image_name="img",
        model_def="m.f",
        training_data="/data/train",
        platform="kubernetes",
    )
    fields.update(kwargs)
    return JobSpec(**fields).resolve()[0]


def test_a_job_dir_on_a_volume_makes_the_master_a_job_template():
    job = _job(volume="claim_name=c,mount_path=/data", job_dir="/data/jobs/j")
    backend = KubernetesBackend(namespace="ns")
    pod = backend.build_master_pod(job)
    master = backend.build_master_job(pod, job)
    assert (master.kind, master.metadata.name) == ("Job", "elasticdl-j-master")
    assert master.spec.backoff_limit == MASTER_RESTARTS
    template = master.spec.template
    assert template.spec.restart_policy == "Never"
    assert template.metadata.labels["elasticdl-replica-type"] == "master"
    # No declared port: on the host network it would be a host port the dead master's pod
    # still holds, and the next master would stay Pending.
    assert template.spec.containers[0].ports is None
    assert '"job_dir":"/data/jobs/j"' in " ".join(template.spec.containers[0].command)
    # Without --job_dir: the bare master pod of before, with its port.
    bare = backend.build_master_pod(_job(volume="claim_name=c,mount_path=/data"))
    assert bare.spec.containers[0].ports[0].container_port == 50001


@pytest.mark.parametrize(
    "volume, job_dir, says",
    [
        ("claim_name=c,mount_path=/data", "jobs/j", "must be an absolute path"),
        ("", "/data/jobs/j", "is on no writable --volume"),
        ("claim_name=c,mount_path=/data", "/database/j", "is on no writable --volume"),
        ("claim_name=c,mount_path=/data,read_only=true", "/data/j", "is on no writable --volume"),
    ],
)
def test_a_job_dir_outside_every_writable_volume_is_refused(volume, job_dir, says):
    with pytest.raises(ClientError) as e:
        KubernetesBackend(namespace="ns").build_master_pod(_job(volume=volume, job_dir=job_dir))
    assert "--job_dir" in str(e.value) and says in str(e.value)


def _pod(job: str, name: str, phase: str, minute: int):
    from kubernetes import client

    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name,
            labels={"elasticdl-job-name": job},
            creation_timestamp=datetime.datetime(2026, 1, 1, 0, minute),
        ),
        status=client.V1PodStatus(phase=phase),
    )


def test_each_job_is_its_live_master_pod_else_its_newest():
    pods = [
        _pod("a", "a-1", "Failed", 1),
        _pod("a", "a-2", "Running", 2),
        _pod("a", "a-0", "Failed", 3),  # newer, but dead: the live one is the job's master
        _pod("b", "b-1", "Failed", 1),
        _pod("b", "b-2", "Failed", 5),
    ]
    assert sorted(p.metadata.name for p in current_masters(pods)) == ["a-2", "b-2"]


def test_a_master_that_exits_0_after_a_failed_job_reads_failed():
    assert job_phase("", "Succeeded", "Failed") == "Failed"
    assert job_phase("", "Succeeded", "Running") == "Succeeded"
    assert job_phase("Cancelled", "Succeeded", "Failed") == "Cancelled"
