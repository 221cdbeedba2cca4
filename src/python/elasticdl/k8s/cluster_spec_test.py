"""Tests of --cluster_spec / --cluster_spec_json on real kubernetes.client models."""

import json

import pytest

pytest.importorskip("kubernetes")

from elasticdl.k8s.client import to_dict  # noqa: E402
from elasticdl.k8s.cluster_spec import ClusterSpec, ClusterSpecError  # noqa: E402
from elasticdl.k8s.pods import PodTemplate, build_pod, build_service  # noqa: E402

# A --cluster_spec file as users write them (the on-prem tutorial's example, plus an attempt
# to overwrite ElasticDL's own labels, which must not succeed).
EXAMPLE_SOURCE = """
from kubernetes import client


class MyCluster:
    def __init__(self):
        self._pool = "elasticdl"
        self._app_name = "elasticdl"

    def with_pod(self, pod):
        pod.metadata.labels["my_app"] = self._app_name
        # An attempt to hijack ElasticDL's own labels must not succeed.
        pod.metadata.labels["elasticdl-job-name"] = "someone-else"
        pod.spec.tolerations = [
            client.V1Toleration(
                effect="NoSchedule",
                key="mycluster.com/app-pool",
                operator="Equal",
                value=self._pool,
            )
        ]
        return pod

    def with_service(self, service):
        service.spec.type = "ClusterIP"
        service.spec.cluster_ip = "None"
        service.metadata.labels["my_app"] = self._app_name
        return service


cluster = MyCluster()
"""


@pytest.fixture
def example(tmp_path):
    path = tmp_path / "spec.py"
    path.write_text(EXAMPLE_SOURCE)
    return str(path)


def _pod(spec: ClusterSpec, replica_type: str = "worker"):
    template = PodTemplate(namespace="ns", envs={"A": "1"}, cluster_spec=spec)
    return build_pod(
        template,
        name=f"elasticdl-j-{replica_type}-0",
        job_name="j",
        replica_type=replica_type,
        replica_id=0,
        image="img",
        command=["python", "-m", "x"],
        env={"B": "2"},
    )


def _service(spec: ClusterSpec):
    template = PodTemplate(namespace="ns", cluster_spec=spec)
    return build_service(
        template, name="elasticdl-j-ps-0", job_name="j", replica_type="ps", replica_id=0, port=2222
    )


def test_python_spec_patches_pods_and_services_but_not_job_labels(example):
    spec = ClusterSpec.load(cluster_spec=example)
    pod = to_dict(_pod(spec))
    assert pod["metadata"]["labels"]["my_app"] == "elasticdl"
    assert pod["metadata"]["labels"]["elasticdl-job-name"] == "j"  # protected
    assert pod["spec"]["tolerations"] == [
        {
            "effect": "NoSchedule",
            "key": "mycluster.com/app-pool",
            "operator": "Equal",
            "value": "elasticdl",
        }
    ]
    service = to_dict(_service(spec))
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["type"] == "ClusterIP"
    assert service["metadata"]["labels"]["my_app"] == "elasticdl"


def test_json_spec_applies_common_then_per_type_patches():
    data = {
        "pod_spec": {
            "labels": {"team": "ml"},
            "annotations": {"a": "b"},
            "env": {"A": "overridden"},
            "tolerations": [
                {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 600,
                },
            ],
        },
        "worker_pod_spec": {
            "labels": {"team": "ml-workers"},
            "node_selector": {"pool": "cpu"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["a"]}
                                ]
                            }
                        ]
                    }
                }
            },
            "env": [{"name": "C", "value": "3"}],
        },
        "ps_pod_spec": {"labels": {"role": "ps"}},
        "service_spec": {"labels": {"svc": "yes"}, "annotations": {"x": "y"}},
    }
    spec = ClusterSpec.load(cluster_spec_json=json.dumps(data))
    worker = to_dict(_pod(spec, "worker"))
    assert worker["metadata"]["labels"]["team"] == "ml-workers"
    assert "role" not in worker["metadata"]["labels"]
    assert worker["metadata"]["annotations"] == {"a": "b"}
    assert worker["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert worker["spec"]["affinity"] == data["worker_pod_spec"]["affinity"]
    # Added to ElasticDL's own; the spec's unreachable toleration replaces ElasticDL's.
    assert worker["spec"]["tolerations"] == [
        {
            "key": "node.kubernetes.io/not-ready",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 30,
        },
        *data["pod_spec"]["tolerations"],
    ]
    env = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0]["env"]}
    assert env["A"] == "overridden" and env["B"] == "2" and env["C"] == "3"
    assert "MY_POD_IP" in env  # downward API variable kept
    master = to_dict(_pod(spec, "master"))
    assert master["metadata"]["labels"]["team"] == "ml" and "nodeSelector" not in master["spec"]
    ps = to_dict(_pod(spec, "ps"))
    assert ps["metadata"]["labels"]["role"] == "ps"
    service = to_dict(_service(spec))
    assert service["metadata"]["labels"]["svc"] == "yes" and service["metadata"]["annotations"] == {
        "x": "y"
    }


def test_json_spec_from_file(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"pod_spec": {"labels": {"k": "v"}}}))
    spec = ClusterSpec.load(cluster_spec_json=f"@{path}")
    assert to_dict(_pod(spec))["metadata"]["labels"]["k"] == "v"


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("{not json", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"pods_spec": {}}', "unknown key 'pods_spec'"),
        ('{"pod_spec": {"label": {}}}', "unknown key 'pod_spec.label'"),
        ('{"pod_spec": {"labels": {"a": 1}}}', "pod_spec.labels must map strings to strings"),
        ('{"service_spec": {"tolerations": []}}', "service_spec takes labels, annotations"),
        ('{"pod_spec": {"affinity": {"nodeAfinity": {"x": 1}}}}', "unknown field 'nodeAfinity'"),
        (
            '{"pod_spec": {"tolerations": [{"key": "k", "efect": "NoSchedule"}]}}',
            "unknown field 'efect'",
        ),
        ('{"pod_spec": {"env": [{"nam": "A"}]}}', "pod_spec.env[0]"),
    ],
)
def test_bad_json_specs_are_one_line_errors(text, fragment):
    with pytest.raises(ClusterSpecError) as info:
        ClusterSpec.load(cluster_spec_json=text)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_bad_python_specs(tmp_path, example):
    with pytest.raises(ClusterSpecError, match="does not exist"):
        ClusterSpec.load(cluster_spec=str(tmp_path / "missing.py"))
    no_cluster = tmp_path / "no_cluster.py"
    no_cluster.write_text("x = 1\n")
    with pytest.raises(ClusterSpecError, match="defines no 'cluster'"):
        ClusterSpec.load(cluster_spec=str(no_cluster))
    half = tmp_path / "half.py"
    half.write_text("class C:\n    def with_pod(self, pod):\n        return pod\ncluster = C()\n")
    with pytest.raises(ClusterSpecError, match="with_service"):
        ClusterSpec.load(cluster_spec=str(half))
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ClusterSpecError, match="RuntimeError: boom"):
        ClusterSpec.load(cluster_spec=str(broken))
    with pytest.raises(ClusterSpecError, match="exclusive"):
        ClusterSpec.load(cluster_spec=example, cluster_spec_json="{}")


def test_empty_spec_changes_nothing():
    spec = ClusterSpec.load()
    assert spec.empty
    pod = to_dict(_pod(spec))
    assert set(pod["metadata"]["labels"]) == {
        "app",
        "elasticdl-job-name",
        "elasticdl-replica-type",
        "elasticdl-replica-index",
    }
