"""The job server on Kubernetes (--platform=kubernetes) against the real kube-apiserver, as
deploy/k8s/server.yaml runs it: under its own ServiceAccount with only that manifest's Role
(the real token the controller-manager mints for it), jobs as master pods labelled with their
owner. The pods are not run (the namespace is not served by the process kubelet): these tests
check what the server creates, lists, hides and deletes, and that the cluster, not the
server's memory, holds it all.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from elasticdl.jobs.errors import ClientError, JobConflictError, JobNotFoundError
from elasticdl.jobs.server_client import JobServerClient
from elasticdl.k8s.client import K8sClient, to_model
from elasticdl.k8s.names import master_pod_name
from elasticdl.server.k8s_jobs import OWNER_LABEL
from elasticdl_testing.server_process import ServerProcess
from elasticdl_tests.k8s.cluster import write_kubeconfig
from elasticdl_tests.k8s.service_accounts import service_account_token

MODEL_DEF = "mnist.mnist_functional_api.custom_model"
IMAGE = "local/elasticdl:test"


def _manifest() -> list[dict]:
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "deploy" / "k8s" / "server.yaml"
        if candidate.exists():
            return [d for d in yaml.safe_load_all(candidate.read_text()) if d]
    pytest.fail("deploy/k8s/server.yaml not found")


def _apply(api_client, namespace: str, kinds: tuple[str, ...] = ()) -> list[str]:
    """Every object of the manifest (only those of ``kinds`` when given), moved to
    ``namespace`` (as its header says to); the kinds applied, in order."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    rbac = client.RbacAuthorizationV1Api(api_client)
    apps = client.AppsV1Api(api_client)
    create = {
        "ServiceAccount": (core.create_namespaced_service_account, "V1ServiceAccount"),
        "Role": (rbac.create_namespaced_role, "V1Role"),
        "RoleBinding": (rbac.create_namespaced_role_binding, "V1RoleBinding"),
        "PersistentVolumeClaim": (
            core.create_namespaced_persistent_volume_claim,
            "V1PersistentVolumeClaim",
        ),
        "Deployment": (apps.create_namespaced_deployment, "V1Deployment"),
        "Service": (core.create_namespaced_service, "V1Service"),
    }
    applied = []
    for doc in _manifest():
        if kinds and doc["kind"] not in kinds:
            continue
        doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects") or []:
            subject["namespace"] = namespace
        call, model = create[doc["kind"]]
        call(namespace, to_model(doc, model))
        applied.append(doc["kind"])
    return applied


@pytest.fixture
def server(k8s_cluster, namespace, tmp_path):
    kinds = _apply(k8s_cluster.api_client(), namespace)
    assert kinds == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "PersistentVolumeClaim",
        "Deployment",
        "Service",
    ]
    kubeconfig = tmp_path / "kubeconfig"
    token = service_account_token(k8s_cluster.api_client(), namespace, "elasticdl-server")
    write_kubeconfig(kubeconfig, k8s_cluster.server, k8s_cluster.ca_file, token, namespace)
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("KUBE")}
    env["KUBECONFIG"] = str(kubeconfig)
    server = ServerProcess(
        tmp_path / "state",
        env,
        "--platform=kubernetes",
        f"--namespace={namespace}",
        "--data_volume=host_path=/srv/edl/data,mount_path=/data",
    )
    server.tokens = {u: server.add_user(u) for u in ("alice", "bob")}
    server.start()
    server.kubeconfig = kubeconfig
    yield server
    server.stop()


def sdk(server, user):
    return JobServerClient(server.url, server.tokens[user])


def test_jobs_are_owned_pods_and_survive_the_server(server, k8s_cluster, namespace):
    alice, bob = sdk(server, "alice"), sdk(server, "bob")
    spec = {
        "job_name": "srvk",
        "model_zoo": "/model_zoo",
        "model_def": MODEL_DEF,
        "training_data": "mnist/train",
        "num_workers": 1,
    }
    submitted = alice.submit_job(spec, image=IMAGE)
    assert submitted.job_name == "srvk" and submitted.platform == "kubernetes"

    admin = K8sClient(namespace, api_client=k8s_cluster.api_client())
    pod = admin.get_pod(master_pod_name("srvk"))
    assert pod.metadata.labels[OWNER_LABEL] == "alice"
    container = pod.spec.containers[0]
    assert container.image == IMAGE
    argv = " ".join(container.command + (container.args or []))
    assert '"training_data":"/data/alice/mnist/train"' in argv
    mounts = {m.mount_path: m.name for m in container.volume_mounts}
    volumes = {v.name: v for v in pod.spec.volumes}
    assert volumes[mounts["/data"]].host_path.path == "/srv/edl/data"

    assert [j.job_name for j in alice.list_jobs()] == ["srvk"]
    assert alice.get_job_status("srvk").phase in ("Pending", "Running")
    # Bob sees nothing of it, cannot cancel it, and cannot take its name.
    assert bob.list_jobs() == []
    with pytest.raises(JobNotFoundError):
        bob.get_job_status("srvk")
    with pytest.raises(JobNotFoundError):
        bob.stop_job("srvk")
    with pytest.raises(JobNotFoundError):
        list(bob.tail_logs("srvk"))
    with pytest.raises(JobConflictError, match="job name 'srvk' is taken"):
        bob.submit_job(dict(spec, training_data="x"), image=IMAGE)
    assert admin.get_pod(master_pod_name("srvk")) is not None

    # What the server decides is not the user's to set; a package needs an image build.
    for bad, message in (
        ({"volume": "host_path=/etc,mount_path=/x"}, "spec.volume cannot be set"),
        ({"training_data": "../bob/x"}, "spec.training_data"),
        ({"namespace": "kube-system"}, "spec.namespace 'kube-system'"),
    ):
        with pytest.raises(ClientError, match=message):
            alice.submit_job(dict(spec, job_name="bad", **bad), image=IMAGE)
    with pytest.raises(ClientError, match="this server builds no images"):
        alice.submit_job(dict(spec, job_name="bad"), package_id="0" * 64)
    assert admin.get_pod(master_pod_name("bad")) is None

    # The cluster holds the jobs and their owners: a new server process knows them.
    server.kill()
    server.start()
    alice, bob = sdk(server, "alice"), sdk(server, "bob")
    assert [j.job_name for j in alice.list_jobs()] == ["srvk"] and bob.list_jobs() == []

    final = alice.stop_job("srvk")
    assert final.phase == "Cancelled"
    deadline = time.monotonic() + 60
    while admin.get_pod(master_pod_name("srvk")) is not None and time.monotonic() < deadline:
        time.sleep(0.3)


def test_the_server_role_grants_nothing_else(server, k8s_cluster, namespace):
    from kubernetes import config as kube_config
    from kubernetes.client.exceptions import ApiException

    api_client = kube_config.new_client_from_config(config_file=str(server.kubeconfig))
    own = K8sClient(namespace, api_client=api_client)
    own.list_pods()  # what it needs
    for forbidden in (
        lambda: own.core.list_namespaced_secret(namespace),
        lambda: own.core.create_namespaced_service(
            namespace,
            to_model({"metadata": {"name": "x"}, "spec": {"ports": [{"port": 1}]}}, "V1Service"),
        ),
        lambda: own.core.list_namespaced_pod("default"),
        lambda: own.core.list_node(),
    ):
        with pytest.raises(ApiException) as caught:
            forbidden()
        # Forbidden by RBAC: the apiserver's 403, not a refused connection or a missing object.
        assert caught.value.status == 403, caught.value
