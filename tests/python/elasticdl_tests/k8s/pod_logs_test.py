"""elasticdl.k8s.pod_logs.ApiPodLogs against a real kube-apiserver: what it does before a
pod's container has started, and for pods that are gone. (There is no kubelet here to serve a
log: the apiserver answers a log request with an error, tests/.../k8s/backend_test.py.)"""

from __future__ import annotations

from elasticdl.k8s.pod_logs import ApiPodLogs
from elasticdl.k8s.pods import PodTemplate, build_pod


def _pending_pod(k8s, namespace: str, name: str) -> None:
    """A pod nobody runs (its namespace is not the stand-in kubelet's): it stays Pending."""
    k8s.create_pod(
        build_pod(
            PodTemplate(namespace=namespace),
            name=name,
            job_name="logs",
            replica_type="worker",
            replica_id=0,
            image="img",
            command=["true"],
        )
    )


def test_no_pod_has_no_log(k8s):
    reader = ApiPodLogs()
    assert reader.read(k8s, "nope") is None
    assert reader.read(k8s, "nope", ("install", "push")) == ""
    assert list(reader.follow(k8s, "nope")) == []


def test_following_a_pod_that_never_starts_ends_when_told(k8s, namespace):
    _pending_pod(k8s, namespace, "waits")
    asked = []

    def active() -> bool:
        asked.append(1)
        return len(asked) < 3

    assert list(ApiPodLogs().follow(k8s, "waits", ("install", "push"), active)) == []
    assert len(asked) == 3  # it waited for the container while told to, then stopped


def test_following_a_pod_that_ended_without_starting_ends(k8s, namespace):
    _pending_pod(k8s, namespace, "failed")
    k8s.patch_pod_status("failed", {"phase": "Failed", "reason": "DeadlineExceeded"})
    assert list(ApiPodLogs().follow(k8s, "failed", ("install",))) == []
