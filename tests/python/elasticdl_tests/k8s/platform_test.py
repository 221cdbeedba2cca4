"""KubernetesPlatform against a real kube-apiserver (+ garbage collector).

Pods are run by the FAKE process kubelet (``process_kubelet``): no images, no containers;
the pod's command runs on this host. Everything else — object validation, admission
(PriorityClasses), watches, graceful deletion, owner references and cascading deletion —
is the real Kubernetes 1.20 control plane.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
from elasticdl.k8s.client import K8sClient, to_dict
from elasticdl.k8s.names import LABEL_STATUS, master_pod_name
from elasticdl.k8s.pods import PodTemplate, build_pod
from elasticdl.platform.base import (
    REASON_DELETED_BY_MASTER,
    REASON_NODE_LOST,
    LaunchSpec,
    PlatformError,
    ReplicaPhase,
    ReplicaType,
)
from elasticdl.platform.kubernetes import NETWORK_HOST, KubernetesPlatform

JOB = "plat"
SLEEPER = "elasticdl_tests.k8s.sleeper"


class _Recorder:
    """Collects every event; ``next`` returns the first not yet claimed match (events of
    different replicas interleave, so order is only checked per replica)."""

    def __init__(self, platform) -> None:
        self.events: list = []
        self._claimed: set[int] = set()
        self._cond = threading.Condition()
        platform.add_event_listener(self._on_event)

    def _on_event(self, event) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def next(self, replica_type, replica_id, phase, timeout=30.0):
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i, event in enumerate(self.events):
                    if i not in self._claimed and (
                        event.replica_type,
                        event.replica_id,
                        event.phase,
                    ) == (replica_type, replica_id, phase):
                        self._claimed.add(i)
                        return event
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(
                        f"no {replica_type}-{replica_id} {phase} event within {timeout}s; "
                        f"saw {self.events}"
                    )
                self._cond.wait(left)

    def of(self, replica_type, replica_id):
        with self._cond:
            return [
                e.phase
                for e in self.events
                if (e.replica_type, e.replica_id) == (replica_type, replica_id)
            ]


def _master(k8s: K8sClient, job: str = JOB):
    """The job's master pod (not run by anyone here: it only owns the replicas)."""
    template = PodTemplate(namespace=k8s.namespace)
    pod = build_pod(
        template,
        name=master_pod_name(job),
        job_name=job,
        replica_type="master",
        replica_id=0,
        image="local/elasticdl:test",
        command=["python", "-c", "pass"],
    )
    return k8s.create_pod(pod)


def _spec(replica_type, replica_id, seconds=3600, exit_code=0, port=None, **kwargs):
    args = ["--seconds", str(seconds), "--exit-code", str(exit_code)]
    if port:
        args += ["--port", str(port)]
    return LaunchSpec(
        replica_type=replica_type,
        replica_id=replica_id,
        module=SLEEPER,
        args=args,
        port=port,
        **kwargs,
    )


def _gone(k8s, selector, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p.metadata.name for p in k8s.list_pods(selector)] + [
            s.metadata.name for s in k8s.list_services(selector)
        ]
        if not left:
            return []
        time.sleep(0.2)
    return left


def test_pods_services_owners_resources_and_events(k8s, served_namespace, kubelet):
    master = _master(k8s)
    platform = KubernetesPlatform(
        JOB,
        k8s,
        image="local/elasticdl:test",
        template=PodTemplate(
            namespace=k8s.namespace, envs={"EDL_JOBWIDE": "1"}, image_pull_policy="Never"
        ),
        network=NETWORK_HOST,
        master_host="127.0.0.1",
    )
    events = _Recorder(platform)
    try:
        ps_addr = platform.address(ReplicaType.PS, 0)
        port = int(ps_addr.rsplit(":", 1)[1])
        assert platform.address(ReplicaType.PS, 0) == ps_addr  # stable
        platform.launch(
            _spec(
                ReplicaType.PS,
                0,
                port=port,
                resource_request="cpu=0.5,memory=256Mi",
                resource_limit="cpu=1,memory=512Mi",
                priority="high",
            )
        )
        platform.launch(
            _spec(
                ReplicaType.WORKER,
                0,
                seconds=0.5,
                resource_request="cpu=1,memory=256Mi,gpu=1",
                env={"EDL_OWN": "w0"},
                priority="low",
            )
        )

        pod = k8s.get_pod(f"elasticdl-{JOB}-ps-0")
        assert pod.metadata.labels == {
            "app": "elasticdl",
            "elasticdl-job-name": JOB,
            "elasticdl-replica-type": "ps",
            "elasticdl-replica-index": "0",
        }
        owner = pod.metadata.owner_references[0]
        assert (owner.kind, owner.name, owner.uid, owner.controller) == (
            "Pod",
            master.metadata.name,
            master.metadata.uid,
            True,
        )
        container = to_dict(pod)["spec"]["containers"][0]
        assert container["command"][:3] == ["python", "-m", SLEEPER]
        assert container["resources"] == {
            "requests": {"cpu": "500m", "memory": "256Mi"},
            "limits": {"cpu": "1", "memory": "512Mi"},
        }
        assert container["imagePullPolicy"] == "Never"
        assert pod.spec.restart_policy == "Never"
        # "high" is ElasticDL's class (elasticdl.k8s.priority_classes); admission resolved it.
        assert (pod.spec.priority_class_name, pod.spec.priority) == ("elasticdl-high", 0)
        env = {e["name"]: e for e in container["env"]}
        assert env["MY_POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert env["EDL_JOBWIDE"]["value"] == "1"

        worker = to_dict(k8s.get_pod(f"elasticdl-{JOB}-worker-0"))
        assert worker["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert (worker["spec"]["priorityClassName"], worker["spec"]["priority"]) == (
            "elasticdl-low",
            -100,
        )

        service = k8s.get_service(f"elasticdl-{JOB}-ps-0")
        assert service.spec.cluster_ip == "None"
        assert service.spec.selector == {
            "app": "elasticdl",
            "elasticdl-job-name": JOB,
            "elasticdl-replica-type": "ps",
            "elasticdl-replica-index": "0",
        }
        assert service.spec.ports[0].port == port
        assert service.metadata.owner_references[0].uid == master.metadata.uid
        assert k8s.get_service(f"elasticdl-{JOB}-worker-0") is None  # workers serve nothing

        events.next(ReplicaType.PS, 0, ReplicaPhase.RUNNING)
        done = events.next(ReplicaType.WORKER, 0, ReplicaPhase.SUCCEEDED)
        assert done.exit_code == 0
        log = kubelet.log_path(k8s.namespace, f"elasticdl-{JOB}-worker-0").read_text()
        assert '"MY_POD_IP": "127.0.0.1"' in log and '"EDL_OWN": "w0"' in log

        # The PS is really listening where address() says.
        import socket

        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "PS never listened on its address"
                time.sleep(0.1)

        # Cascading deletion: removing the master pod removes everything it owns.
        k8s.delete_pod(master.metadata.name, grace_seconds=0)
        assert _gone(k8s, f"elasticdl-job-name={JOB}") == []
    finally:
        platform.shutdown()


def test_preemption_deletion_and_relaunch_events(k8s, served_namespace, kubelet):
    _master(k8s)
    platform = KubernetesPlatform(
        JOB, k8s, image="img", network=NETWORK_HOST, master_host="127.0.0.1"
    )
    events = _Recorder(platform)
    try:
        ps_addr = platform.address(ReplicaType.PS, 0)
        port = int(ps_addr.rsplit(":", 1)[1])
        platform.launch(_spec(ReplicaType.PS, 0, port=port))
        for i in range(3):
            platform.launch(_spec(ReplicaType.WORKER, i))
        for i in range(3):
            events.next(ReplicaType.WORKER, i, ReplicaPhase.RUNNING)
        events.next(ReplicaType.PS, 0, ReplicaPhase.RUNNING)

        with pytest.raises(PlatformError, match="still"):
            platform.launch(_spec(ReplicaType.WORKER, 0))

        # SIGKILL from outside (what preemption / the OOM killer look like): Failed 137.
        assert kubelet.kill(k8s.namespace, f"elasticdl-{JOB}-worker-0", signal.SIGKILL)
        failed = events.next(ReplicaType.WORKER, 0, ReplicaPhase.FAILED)
        assert failed.exit_code == 137 and failed.reason == "Error" and failed.looks_preempted

        # Deleted by the master.
        platform.delete(ReplicaType.WORKER, 1, grace_seconds=5)
        deleted = events.next(ReplicaType.WORKER, 1, ReplicaPhase.DELETED)
        assert deleted.reason == REASON_DELETED_BY_MASTER

        # Deleted by someone else (kubectl delete pod): one Deleted event, not by the master.
        k8s.delete_pod(f"elasticdl-{JOB}-worker-2")
        external = events.next(ReplicaType.WORKER, 2, ReplicaPhase.DELETED)
        assert external.reason != REASON_DELETED_BY_MASTER

        # Relaunch: the finished worker-0 pod is replaced under the same name.
        platform.launch(_spec(ReplicaType.WORKER, 0))
        events.next(ReplicaType.WORKER, 0, ReplicaPhase.RUNNING)

        # A relaunched PS keeps its service and address.
        service_uid = k8s.get_service(f"elasticdl-{JOB}-ps-0").metadata.uid
        platform.delete(ReplicaType.PS, 0, grace_seconds=5)
        events.next(ReplicaType.PS, 0, ReplicaPhase.DELETED)
        platform.launch(_spec(ReplicaType.PS, 0, port=port))
        events.next(ReplicaType.PS, 0, ReplicaPhase.RUNNING)
        assert platform.address(ReplicaType.PS, 0) == ps_addr
        assert k8s.get_service(f"elasticdl-{JOB}-ps-0").metadata.uid == service_uid

        # Exactly one terminal event per pod, in lifecycle order per replica.
        time.sleep(1.0)
        P = ReplicaPhase
        assert events.of(ReplicaType.WORKER, 0) == [
            P.PENDING,
            P.RUNNING,
            P.FAILED,
            P.PENDING,
            P.RUNNING,
        ]
        assert events.of(ReplicaType.WORKER, 1) == [P.PENDING, P.RUNNING, P.DELETED]
        assert events.of(ReplicaType.WORKER, 2) == [P.PENDING, P.RUNNING, P.DELETED]
        assert events.of(ReplicaType.PS, 0) == [
            P.PENDING,
            P.RUNNING,
            P.DELETED,
            P.PENDING,
            P.RUNNING,
        ]

        assert platform.mark_job_status("Succeeded")
        assert k8s.get_pod(master_pod_name(JOB)).metadata.labels[LABEL_STATUS] == "Succeeded"
    finally:
        platform.shutdown(delete_all=True)
    assert _gone(k8s, f"elasticdl-job-name={JOB},elasticdl-replica-type in (ps,worker)") == []
    assert k8s.get_pod(master_pod_name(JOB)) is not None  # shutdown leaves the master alone


def test_pods_of_a_node_that_stopped_answering_are_removed_and_replaced(
    k8s, served_namespace, kubelet
):
    """The kubelet dies with its machine (``ProcessKubelet.lose``: processes killed, nothing
    reported or confirmed again). The deletion that evicts its pods (here by the test: this
    tier runs no node controller) would leave them Terminating for ever; the platform removes
    them once past their deletion deadline, reports them ``Deleted`` / ``NodeLost`` (a relaunch
    that uses no budget), and the PS is launched again under its name."""
    _master(k8s)
    platform = KubernetesPlatform(
        JOB,
        k8s,
        image="img",
        network=NETWORK_HOST,
        master_host="127.0.0.1",
        lost_pod_margin_seconds=1.0,
    )
    events = _Recorder(platform)
    ps_name, worker_name = f"elasticdl-{JOB}-ps-0", f"elasticdl-{JOB}-worker-0"
    try:
        port = int(platform.address(ReplicaType.PS, 0).rsplit(":", 1)[1])
        platform.launch(_spec(ReplicaType.PS, 0, port=port))
        platform.launch(_spec(ReplicaType.WORKER, 0))
        events.next(ReplicaType.PS, 0, ReplicaPhase.RUNNING)
        events.next(ReplicaType.WORKER, 0, ReplicaPhase.RUNNING)

        kubelet.lose(served_namespace)
        for name in (ps_name, worker_name):
            k8s.delete_pod(name, grace_seconds=2)
        # Nothing confirms: without the platform the pods would stay.
        assert k8s.get_pod(ps_name).metadata.deletion_timestamp is not None
        for replica_type in (ReplicaType.PS, ReplicaType.WORKER):
            lost = events.next(replica_type, 0, ReplicaPhase.DELETED, timeout=30)
            assert lost.reason == REASON_NODE_LOST and lost.looks_preempted, lost
            assert "stopped answering" in lost.message, lost
        assert k8s.get_pod(ps_name) is None and k8s.get_pod(worker_name) is None

        kubelet.serve(served_namespace)  # the replacement lands on a node that answers
        platform.launch(_spec(ReplicaType.PS, 0, port=port))
        events.next(ReplicaType.PS, 0, ReplicaPhase.RUNNING)
        P = ReplicaPhase
        assert events.of(ReplicaType.PS, 0) == [
            P.PENDING,
            P.RUNNING,
            P.DELETED,
            P.PENDING,
            P.RUNNING,
        ]
    finally:
        platform.shutdown(delete_all=True)


def test_pod_network_addresses_and_launch_errors(k8s, namespace):
    """Real-cluster addressing (service DNS names) and API errors; nothing is run here."""
    platform = KubernetesPlatform(JOB, k8s, image="img")  # no master pod: no owner references
    try:
        assert platform.address(ReplicaType.PS, 1) == f"elasticdl-{JOB}-ps-1.{namespace}.svc:2222"
        assert (
            platform.log_location(ReplicaType.WORKER, 3)
            == f"kubectl logs -n {namespace} elasticdl-{JOB}-worker-3"
        )
        platform.launch(_spec(ReplicaType.PS, 1, port=2222))
        assert k8s.get_pod(f"elasticdl-{JOB}-ps-1").metadata.owner_references is None
        with pytest.raises(PlatformError, match="PriorityClass|priority"):
            platform.launch(_spec(ReplicaType.WORKER, 0, priority="no-such-class"))
        with pytest.raises(PlatformError, match="cpu"):
            platform.launch(_spec(ReplicaType.WORKER, 1, resource_request="cpu=lots"))
        assert k8s.get_pod(f"elasticdl-{JOB}-worker-0") is None
    finally:
        platform.shutdown()
    with pytest.raises(PlatformError, match="shut down"):
        platform.launch(_spec(ReplicaType.WORKER, 5))
