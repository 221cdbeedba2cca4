"""elasticdl.k8s.client against a real kube-apiserver (no kubelet involved)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from elasticdl.k8s.client import (
    K8sApiError,
    K8sClient,
    K8sConfigError,
    KubeConfig,
    load_api_client,
    to_dict,
)
from elasticdl.k8s.pods import PodTemplate, build_pod, build_service


def _pod(namespace, name, replica_type="worker", replica_id=0, owner=None):
    return build_pod(
        PodTemplate(namespace=namespace),
        name=name,
        job_name="cl",
        replica_type=replica_type,
        replica_id=replica_id,
        image="img",
        command=["true"],
        owner_reference=owner,
    )


def test_kubeconfig_loading_verifies_tls_and_contexts(
    k8s_cluster, namespace, tmp_path, monkeypatch
):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    api_client = load_api_client(KubeConfig(kubeconfig=str(k8s_cluster.kubeconfig)))
    assert K8sClient(namespace, api_client=api_client).list_pods() == []
    monkeypatch.setenv("KUBECONFIG", str(k8s_cluster.kubeconfig))
    assert K8sClient(namespace, config=KubeConfig(context="elasticdl-test")).list_pods() == []
    with pytest.raises(K8sConfigError, match="context 'nope'"):
        load_api_client(KubeConfig(context="nope"))
    with pytest.raises(K8sConfigError, match="no kubeconfig"):
        load_api_client(KubeConfig(kubeconfig=str(tmp_path / "missing")))
    # A kubeconfig whose CA does not match is refused (TLS is really verified).
    config = json.loads(k8s_cluster.kubeconfig.read_text())
    wrong = tmp_path / "wrong-ca"
    other_ca = (k8s_cluster.cert_dir / "server.crt").read_bytes()  # not a CA of the server cert
    import base64

    config["clusters"][0]["cluster"]["certificate-authority-data"] = base64.b64encode(
        other_ca
    ).decode()
    wrong.write_text(json.dumps(config))
    client = K8sClient(namespace, config=KubeConfig(kubeconfig=str(wrong)))
    with pytest.raises(Exception, match="(?i)certificate|ssl"):
        client.core.list_namespaced_pod(namespace, _request_timeout=5)


def test_pods_services_errors_and_labels(k8s, namespace):
    created = k8s.create_pod(_pod(namespace, "elasticdl-cl-worker-0"))
    assert created.metadata.uid
    with pytest.raises(K8sApiError) as conflict:
        k8s.create_pod(_pod(namespace, "elasticdl-cl-worker-0"))
    assert conflict.value.status == 409 and "AlreadyExists" in str(conflict.value)
    bad = _pod(namespace, "Bad_Name")
    with pytest.raises(K8sApiError) as invalid:
        k8s.create_pod(bad)
    assert invalid.value.status == 422
    assert k8s.get_pod("missing") is None
    assert k8s.delete_pod("missing") is False

    k8s.create_pod(_pod(namespace, "elasticdl-cl-ps-0", "ps"))
    assert [p.metadata.name for p in k8s.list_pods("elasticdl-replica-type=ps")] == [
        "elasticdl-cl-ps-0"
    ]
    assert len(k8s.list_pods("elasticdl-replica-type in (ps,worker)")) == 2
    k8s.patch_pod_labels("elasticdl-cl-ps-0", {"status": "Finished"})
    assert k8s.get_pod("elasticdl-cl-ps-0").metadata.labels["status"] == "Finished"

    service = build_service(
        PodTemplate(namespace=namespace),
        name="elasticdl-cl-ps-0",
        job_name="cl",
        replica_type="ps",
        replica_id=0,
        port=2222,
    )
    assert to_dict(k8s.create_service(service))["spec"]["clusterIP"] == "None"
    assert k8s.delete_service("elasticdl-cl-ps-0") is True  # 1.20 answers with a Status: handled
    assert k8s.delete_service("elasticdl-cl-ps-0") is False
    k8s.bind_pod("elasticdl-cl-ps-0", "some-node")  # 1.20 answers with a Status: handled
    assert k8s.get_pod("elasticdl-cl-ps-0").spec.node_name == "some-node"
    assert k8s.delete_pod("elasticdl-cl-worker-0", grace_seconds=0) is True
    assert k8s.wait_pod_gone("elasticdl-cl-worker-0", 10)


def test_watch_pods_streams_events_in_order(k8s, namespace):
    k8s.create_pod(_pod(namespace, "elasticdl-cl-worker-0"))
    stop = threading.Event()
    events: list[tuple[str, str, str]] = []

    def consume():
        for kind, pod in k8s.watch_pods("elasticdl-job-name=cl", stop, timeout_seconds=2):
            events.append((kind, pod.metadata.name, (pod.status.phase if pod.status else "") or ""))

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    try:
        _wait_for(lambda: ("ADDED", "elasticdl-cl-worker-0", "Pending") in events)
        k8s.create_pod(_pod(namespace, "elasticdl-cl-worker-1", replica_id=1))
        k8s.patch_pod_status("elasticdl-cl-worker-1", {"phase": "Running"})
        k8s.delete_pod("elasticdl-cl-worker-1", grace_seconds=0)
        time.sleep(2.5)  # across a watch timeout: the stream resumes without losing anything
        k8s.patch_pod_status("elasticdl-cl-worker-0", {"phase": "Failed"})
        _wait_for(lambda: ("MODIFIED", "elasticdl-cl-worker-0", "Failed") in events)
    finally:
        stop.set()
        thread.join(10)
    worker1 = [(k, p) for k, n, p in events if n == "elasticdl-cl-worker-1"]
    assert worker1[0] == ("ADDED", "Pending")
    assert ("MODIFIED", "Running") in worker1
    assert worker1[-1][0] == "DELETED"
    assert not thread.is_alive()


def _wait_for(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)
