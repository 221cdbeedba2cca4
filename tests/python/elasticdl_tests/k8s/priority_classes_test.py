"""ElasticDL's PriorityClasses and what the client checks before it submits, against a real
kube-apiserver (its Priority admission resolves the classes to values).

The session cluster has ElasticDL's classes (conftest, from the same manifests as
``deploy/k8s/priorityclasses.yaml``); a test that needs a cluster without them deletes them
and puts them back. The master pods submitted here are not run: only what the client creates
(or refuses to create) matters. Nodes are Node objects created here with the allocatable a
kubelet would report; no kubelet runs on them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from elasticdl.client.job_commands import job_parser, spec_from_flags
from elasticdl.client.main import main
from elasticdl.jobs.config import ClientConfig
from elasticdl.jobs.errors import ClientError
from elasticdl.jobs.k8s_backend import KubernetesBackend
from elasticdl.k8s import priority_classes, submit_checks
from elasticdl.k8s.client import to_model
from elasticdl.k8s.names import master_pod_name


def _manifest() -> Path:
    for parent in [*Path(__file__).resolve().parents, Path.cwd()]:
        candidate = parent / "deploy" / "k8s" / "priorityclasses.yaml"
        if candidate.exists():
            return candidate
    pytest.fail("deploy/k8s/priorityclasses.yaml not found")


def _spec(namespace: str, *extra: str, job: str = "prio"):
    args = job_parser("train").parse_args(
        [
            f"--job_name={job}",
            "--image_name=local/elasticdl:test",
            "--platform=kubernetes",
            "--model_def=mnist.mnist_functional_api.custom_model",
            "--training_data=/data/mnist/train",
            f"--namespace={namespace}",
            "--num_workers=2",
            "--num_ps_pods=1",
            *extra,
        ]
    )
    spec, _ = spec_from_flags("train", args, ClientConfig())
    return spec


def _sent_spec(pod):
    from elasticdl.master.main import read_job_spec

    return read_job_spec(pod.spec.containers[0].command[3:])


@pytest.fixture
def scheduling(k8s_cluster):
    from kubernetes import client

    return client.SchedulingV1Api(k8s_cluster.api_client())


@pytest.fixture
def without_elasticdl_classes(scheduling):
    """A cluster where ElasticDL's classes were never installed (put back afterwards)."""
    for name in (priority_classes.HIGH_CLASS, priority_classes.LOW_CLASS):
        scheduling.delete_priority_class(name)
    try:
        yield
    finally:
        for manifest in priority_classes.manifests():
            scheduling.create_priority_class(to_model(manifest, "V1PriorityClass"))


def test_the_shipped_classes_are_the_printed_ones_and_the_api_server_takes_them(capsys, scheduling):
    assert main(["rbac", "--priority_classes"]) == 0
    printed = capsys.readouterr().out
    assert printed == priority_classes.render() == _manifest().read_text()
    docs = [d for d in yaml.safe_load_all(printed) if d]
    # The session cluster was given these documents: the API server kept what they say.
    for doc in docs:
        stored = scheduling.read_priority_class(doc["metadata"]["name"])
        assert (stored.value, stored.preemption_policy, bool(stored.global_default)) == (
            doc["value"],
            doc["preemptionPolicy"],
            False,
        )
    values = {d["metadata"]["name"]: d["value"] for d in docs}
    # Master and PS above the preemptible workers; the workers never preempt.
    assert values["elasticdl-high"] > values["elasticdl-low"]
    assert scheduling.read_priority_class("elasticdl-low").preemption_policy == "Never"


def test_unset_priorities_default_to_the_classes_and_high_low_name_them(k8s, namespace):
    backend = KubernetesBackend(namespace=namespace, k8s=k8s)
    handle = backend.submit(_spec(namespace))
    master = k8s.get_pod(master_pod_name("prio"))
    # Priority admission resolved the class the client named.
    assert (master.spec.priority_class_name, master.spec.priority) == ("elasticdl-high", 0)
    sent = _sent_spec(master)
    assert (sent.master_pod_priority, sent.ps_pod_priority, sent.worker_pod_priority) == (
        "high",
        "high",
        "low",
    )
    assert any("--worker_pod_priority=low" in n for n in handle.notices), handle.notices
    backend.cancel("prio")

    # Given values are kept; "low" for the master names ElasticDL's low class.
    handle = backend.submit(
        _spec(namespace, "--master_pod_priority=low", "--worker_pod_priority=0.5", job="given")
    )
    master = k8s.get_pod(master_pod_name("given"))
    assert (master.spec.priority_class_name, master.spec.priority) == ("elasticdl-low", -100)
    sent = _sent_spec(master)
    assert (sent.master_pod_priority, sent.ps_pod_priority, sent.worker_pod_priority) == (
        "low",
        "high",
        "0.5",
    )
    backend.cancel("given")


def test_an_explicit_class_name_is_used_as_given_and_a_missing_one_refused(
    k8s, namespace, scheduling
):
    from kubernetes import client

    backend = KubernetesBackend(namespace=namespace, k8s=k8s)
    scheduling.create_priority_class(
        client.V1PriorityClass(metadata=client.V1ObjectMeta(name="edl-test-batch"), value=50)
    )
    try:
        backend.submit(_spec(namespace, "--master_pod_priority=edl-test-batch", job="named"))
        master = k8s.get_pod(master_pod_name("named"))
        assert (master.spec.priority_class_name, master.spec.priority) == ("edl-test-batch", 50)
        backend.cancel("named")
    finally:
        scheduling.delete_priority_class("edl-test-batch")

    with pytest.raises(ClientError) as refused:
        backend.submit(_spec(namespace, "--ps_pod_priority=edl-no-such-class", job="nosuch"))
    message = str(refused.value)
    assert "\n" not in message
    assert "--ps_pod_priority" in message and "'edl-no-such-class' does not exist" in message
    assert k8s.list_pods() == []  # nothing submitted


def test_without_the_classes_unset_stays_unset_and_high_says_how_to_install_them(
    k8s, namespace, without_elasticdl_classes
):
    backend = KubernetesBackend(namespace=namespace, k8s=k8s)
    handle = backend.submit(_spec(namespace, job="plain"))
    master = k8s.get_pod(master_pod_name("plain"))
    assert master.spec.priority_class_name is None and master.spec.priority == 0
    sent = _sent_spec(master)
    assert (sent.master_pod_priority, sent.ps_pod_priority, sent.worker_pod_priority) == ("",) * 3
    assert not any("priorit" in n for n in handle.notices), handle.notices
    backend.cancel("plain")

    with pytest.raises(ClientError) as refused:
        backend.submit(_spec(namespace, "--worker_pod_priority=high", job="wants"))
    message = str(refused.value)
    assert "--worker_pod_priority=high" in message and "elasticdl-high" in message
    assert "elasticdl rbac --priority_classes | kubectl apply -f -" in message
    assert k8s.get_pod(master_pod_name("wants")) is None


def test_a_client_that_may_not_read_classes_or_nodes_changes_and_says_nothing(
    k8s_cluster, namespace
):
    """The tester user has no rights at all: PriorityClasses and nodes answer 403."""
    spec = _spec(namespace, "--worker_pod_priority=high")
    checked, notices = submit_checks.check(spec, k8s_cluster.api_client(k8s_cluster.user_token))
    assert checked == spec and notices == []


@pytest.fixture
def nodes(k8s_cluster):
    """Two Node objects with the allocatable their kubelets would report (deleted after)."""
    from kubernetes import client

    core = client.CoreV1Api(k8s_cluster.api_client())
    made = []

    def make(name: str, cpu: str, memory: str, unschedulable: bool = False):
        node = client.V1Node(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1NodeSpec(unschedulable=unschedulable or None),
            status=client.V1NodeStatus(
                allocatable={"cpu": cpu, "memory": memory, "pods": "110"},
                capacity={"cpu": cpu, "memory": memory, "pods": "110"},
            ),
        )
        made.append(core.create_node(node).metadata.name)

    yield make
    for name in made:
        core.delete_node(name)


def test_a_request_no_node_can_hold_is_a_one_line_warning(k8s, namespace, nodes):
    nodes("edl-test-node-a", "4", "8Gi")
    nodes("edl-test-node-b", "6", "4Gi")
    nodes("edl-test-node-cordoned", "64", "256Gi", unschedulable=True)
    backend = KubernetesBackend(namespace=namespace, k8s=k8s)
    handle = backend.submit(
        _spec(
            namespace,
            "--worker_resource_request=cpu=5,memory=6Gi",  # a: too few CPUs, b: too little memory
            "--ps_resource_request=cpu=2,memory=2Gi",  # fits either
            job="big",
        )
    )
    warnings = [n for n in handle.notices if n.startswith("warning:")]
    assert len(warnings) == 1 and "\n" not in warnings[0], handle.notices
    assert "a worker's request (cpu=5,memory=6Gi" in warnings[0]
    assert "cpu 6, memory 8Gi" in warnings[0]  # the most any schedulable node offers
    # Still submitted: nodes may come.
    assert k8s.get_pod(master_pod_name("big")) is not None
    backend.cancel("big")

    handle = backend.submit(_spec(namespace, "--worker_resource_request=cpu=4,memory=2Gi"))
    assert not [n for n in handle.notices if n.startswith("warning:")], handle.notices
    backend.cancel("prio")
