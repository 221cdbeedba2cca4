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


def test_secret_envs_reach_every_pod_as_secret_key_refs_only():
    from elasticdl.common.job_spec import JobSpec
    from elasticdl.jobs.k8s_backend import KubernetesBackend

    job = JobSpec(
        job_name="j",
        image_name="img",
        model_def="m.f",
        training_data="/data",
        envs="PLAIN=1",
        secret_envs="AWS_SECRET_ACCESS_KEY=s3-creds/secret-key, TOKEN=api.token/value",
    )
    refs = {
        "AWS_SECRET_ACCESS_KEY": {"name": "s3-creds", "key": "secret-key"},
        "TOKEN": {"name": "api.token", "key": "value"},
    }
    # A replica: also when the master's own environment (which holds the values) is copied
    # to it by --populate_env_names, the value is not in its spec.
    worker = build_pod(
        PodTemplate.from_spec(job),
        name="elasticdl-j-worker-0",
        job_name="j",
        replica_type="worker",
        replica_id=0,
        image="img",
        command=["python", "-m", "x"],
        env={"TOKEN": "the-value-itself"},
    )
    master = KubernetesBackend(namespace="ns").build_master_pod(job.resolve()[0])
    for pod in (worker, master):
        env = {e.name: e for e in pod.spec.containers[0].env}
        assert env["PLAIN"].value == "1"
        for name, ref in refs.items():
            assert env[name].value is None
            selector = env[name].value_from.secret_key_ref
            assert {"name": selector.name, "key": selector.key} == ref
        assert "the-value-itself" not in str(pod.to_dict())


@pytest.mark.parametrize(
    "value, message",
    [
        ("TOKEN", "--secret_envs: 'TOKEN' is not NAME=<secret>/<key>"),
        ("TOKEN=creds", "--secret_envs: 'TOKEN=creds' is not NAME=<secret>/<key>"),
        ("1X=creds/k", "is not NAME=<secret>/<key>"),
        ("TOKEN=Creds/k", "--secret_envs: 'Creds' (for TOKEN) is not a Secret name"),
        ("TOKEN=creds/a b", "--secret_envs: 'a b' (for TOKEN) is not a Secret key"),
        ("T=c/k,T=c/j", "--secret_envs: T is given twice"),
    ],
)
def test_bad_secret_envs_are_one_line_naming_the_flag(value, message):
    from elasticdl.common.job_spec import JobSpec
    from elasticdl.common.spec_codec import SpecError

    with pytest.raises(SpecError) as info:
        JobSpec(job_name="j", secret_envs=value)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_secret_envs_are_refused_where_they_cannot_work():
    from elasticdl.common.job_spec import JobSpec
    from elasticdl.common.spec_codec import SpecError

    common = dict(job_name="j", model_def="m.f", training_data="/d")
    with pytest.raises(SpecError, match="^--secret_envs reads Kubernetes Secrets.*export the"):
        JobSpec(platform="local", secret_envs="T=c/k", **common).resolve(check_local_paths=False)
    with pytest.raises(SpecError, match="^T is set by both --envs and --secret_envs"):
        JobSpec(image_name="img", envs="T=x", secret_envs="T=c/k", **common).resolve()
    # A reference written into --envs would reach the pods as text: pointed to --secret_envs.
    with pytest.raises(SpecError, match="use --secret_envs=T=<secret>/<key>"):
        JobSpec(job_name="j", envs="T=secretKeyRef:c/k")


def test_every_pod_leaves_a_lost_node_after_the_jobs_node_lost_timeout():
    from elasticdl.common.job_spec import JobSpec

    spec = JobSpec(job_name="j", model_def="m.f", node_lost_timeout=12)
    for replica_type, replica_id in (("master", None), ("ps", 0), ("worker", 3)):
        pod = build_pod(
            PodTemplate.from_spec(spec),
            name="p",
            job_name="j",
            replica_type=replica_type,
            replica_id=replica_id,
            image="img",
            command=["x"],
        )
        tolerations = {
            (t.key, t.operator, t.effect, t.toleration_seconds) for t in pod.spec.tolerations
        }
        assert tolerations == {
            ("node.kubernetes.io/not-ready", "Exists", "NoExecute", 12),
            ("node.kubernetes.io/unreachable", "Exists", "NoExecute", 12),
        }
    # The default: not Kubernetes' 300 s.
    assert PodTemplate().node_lost_timeout == JobSpec(job_name="j").node_lost_timeout == 30


def test_workers_and_ps_prefer_nodes_with_fewer_of_their_kind_and_the_master_has_no_preference():
    (spread,) = _pod({}).spec.topology_spread_constraints
    assert spread.when_unsatisfiable == "ScheduleAnyway"  # a preference: never left Pending
    assert spread.topology_key == "kubernetes.io/hostname" and spread.max_skew == 1
    assert spread.label_selector.match_labels == {
        "app": "elasticdl",
        "elasticdl-job-name": "j",
        "elasticdl-replica-type": "worker",
    }
    master = build_pod(
        PodTemplate(),
        name="m",
        job_name="j",
        replica_type="master",
        replica_id=None,
        image="img",
        command=["x"],
    )
    assert master.spec.topology_spread_constraints is None
