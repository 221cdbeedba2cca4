"""The pod builder's network mode: ELASTICDL_K8S_NETWORK=host (in --envs) puts every pod of the
job on the node's network (hostNetwork), the only mode a one-node cluster without a pod
network can run multi-replica jobs in; the default leaves the pod network alone."""

from __future__ import annotations

import pytest

pytest.importorskip("kubernetes")

from elasticdl.k8s.names import NETWORK_ENV  # noqa: E402
from elasticdl.k8s.pods import PodTemplate, build_pod  # noqa: E402


def _pod(envs: dict[str, str], replica_env: dict[str, str] | None = None):
    return build_pod(
        PodTemplate(namespace="ns", envs=envs),
        name="elasticdl-j-worker-0",
        job_name="j",
        replica_type="worker",
        replica_id=0,
        image="img",
        command=["python", "-m", "x"],
        env=replica_env,
    )


def test_host_network_mode_sets_host_network_and_keeps_the_variable():
    pod = _pod({NETWORK_ENV: "host"})
    assert pod.spec.host_network is True
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert env[NETWORK_ENV] == "host"
    # MY_POD_IP (the node's IP on the host network) still comes from the downward API.
    assert "MY_POD_IP" in env and env["MY_POD_IP"] is None


@pytest.mark.parametrize("envs", [{}, {NETWORK_ENV: "pod"}, {"OTHER": "host"}])
def test_other_modes_leave_the_pod_network(envs):
    assert _pod(envs).spec.host_network is None


def test_only_the_master_gets_api_credentials_and_secrets_stay_out_of_the_spec():
    worker = build_pod(
        PodTemplate(namespace="ns"),
        name="elasticdl-j-worker-0",
        job_name="j",
        replica_type="worker",
        replica_id=0,
        image="img",
        command=["python", "-m", "x"],
        secret_env={"ELASTICDL_JOB_SECRET": ("elasticdl-j-secret", "ELASTICDL_JOB_SECRET")},
    )
    assert worker.spec.automount_service_account_token is False
    (var,) = [e for e in worker.spec.containers[0].env if e.name == "ELASTICDL_JOB_SECRET"]
    assert var.value is None
    assert var.value_from.secret_key_ref.name == "elasticdl-j-secret"
    master = build_pod(
        PodTemplate(namespace="ns"),
        name="elasticdl-j-master",
        job_name="j",
        replica_type="master",
        replica_id=0,
        image="img",
        command=["python", "-m", "x"],
    )
    assert master.spec.automount_service_account_token is None  # the namespace's default
