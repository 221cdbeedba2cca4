"""KubernetesPlatform under a restartable master, against a real kube-apiserver
and its Job controller: a master pod run by a batch/v1 Job makes the Job the owner of its
replicas; the platform of a "next" master adopts the pods the first one recorded by name and
UID, reports how the ones that ended meanwhile ended, and deletes one it never recorded.

The master here is a sleeping pod of the Job (the platforms run in this test process, with the
Job's pod as their master pod). Pods are run by the FAKE process kubelet (``process_kubelet``).
"""

from __future__ import annotations

import signal
import time

from elasticdl.k8s.client import K8sClient
from elasticdl.k8s.names import job_labels, master_pod_name
from elasticdl.k8s.pods import PodTemplate, build_pod
from elasticdl.platform.base import ReplicaPhase, ReplicaType
from elasticdl.platform.kubernetes import NETWORK_HOST, KubernetesPlatform
from elasticdl_tests.k8s.platform_test import _gone, _Recorder, _spec

JOB = "adopt"
P = ReplicaPhase
W, PS = ReplicaType.WORKER, ReplicaType.PS


def _master_job(k8s: K8sClient) -> str:
    """A Job whose one pod sleeps; returns that pod's name once it runs."""
    from kubernetes import client

    pod = build_pod(
        PodTemplate(namespace=k8s.namespace),
        name="unused",
        job_name=JOB,
        replica_type="master",
        replica_id=0,
        image="local/elasticdl:test",
        command=["python", "-c", "import time; time.sleep(600)"],
    )
    labels = job_labels(JOB, "master", 0)
    k8s.create_job(
        client.V1Job(
            metadata=client.V1ObjectMeta(name=master_pod_name(JOB), labels=labels),
            spec=client.V1JobSpec(
                backoff_limit=1,
                template=client.V1PodTemplateSpec(
                    metadata=client.V1ObjectMeta(labels=labels), spec=pod.spec
                ),
            ),
        )
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pods = k8s.list_pods("elasticdl-replica-type=master")
        if pods and pods[0].status.phase == "Running":
            return pods[0].metadata.name
        time.sleep(0.2)
    raise AssertionError("the Job's master pod did not run")


def _platform(k8s, master_pod):
    return KubernetesPlatform(
        JOB,
        k8s,
        image="local/elasticdl:test",
        template=PodTemplate(namespace=k8s.namespace, image_pull_policy="Never"),
        network=NETWORK_HOST,
        master_pod=master_pod,
        master_host="127.0.0.1",
    )


def test_next_master_adopts_recorded_pods_and_deletes_unrecorded(k8s, served_namespace, kubelet):
    ns = served_namespace
    master = _master_job(k8s)
    first = _platform(k8s, master)
    events = _Recorder(first)
    assert first.replicas_outlive_master and first.restarts_dead_master
    ps_addr = first.address(PS, 0)
    ps = _spec(PS, 0, port=int(ps_addr.rsplit(":", 1)[1]))
    specs = {(W, 0): _spec(W, 0), (W, 1): _spec(W, 1), (PS, 0): ps}
    for spec in specs.values():
        first.launch(spec)
    for key in specs:
        events.next(*key, P.RUNNING)
    identities = {key: first.replica_identity(*key) for key in specs}
    assert identities[(W, 0)]["pod"] == f"elasticdl-{JOB}-worker-0" and identities[(W, 0)]["uid"]
    for pod in k8s.list_pods(f"elasticdl-job-name={JOB},elasticdl-replica-type in (ps,worker)"):
        assert [(o.kind, o.name, o.controller) for o in pod.metadata.owner_references] == [
            ("Job", master_pod_name(JOB), False)
        ]
    # The first master dies (its platform just stops watching); meanwhile worker-1 is killed
    # and a worker-2 appears that no master recorded (one that died right after creating it).
    first.shutdown(delete_all=False)
    assert kubelet.kill(ns, f"elasticdl-{JOB}-worker-1", signal.SIGKILL)
    stray = build_pod(
        PodTemplate(namespace=ns),
        name=f"elasticdl-{JOB}-worker-2",
        job_name=JOB,
        replica_type="worker",
        replica_id=2,
        image="local/elasticdl:test",
        command=["python", "-c", "import time; time.sleep(600)"],
    )
    k8s.create_pod(stray)
    deadline = time.monotonic() + 30
    while k8s.get_pod(f"elasticdl-{JOB}-worker-1").status.phase != "Failed":
        assert time.monotonic() < deadline, "worker-1 did not fail"
        time.sleep(0.2)

    second = _platform(k8s, master)
    events = _Recorder(second)
    try:
        second.reserve_address(PS, 0, ps_addr)
        assert second.address(PS, 0) == ps_addr
        time.sleep(1)  # the watch has listed the old pods: none of their events came through
        assert events.events == []
        assert second.reclaim(W, 2) == 1
        assert k8s.get_pod(f"elasticdl-{JOB}-worker-2") is None
        assert second.adopt(specs[(W, 0)], identities[(W, 0)]) is True
        assert second.adopt(specs[(PS, 0)], identities[(PS, 0)]) is True
        ended = second.adopt(specs[(W, 1)], identities[(W, 1)])
        assert ended is False
        failed = events.next(W, 1, P.FAILED)
        assert failed.exit_code == 137
        events.next(W, 0, P.RUNNING)
        events.next(PS, 0, P.RUNNING)
        # Another pod under a recorded name is not the replica: deleted, reported Deleted.
        assert second.adopt(specs[(W, 1)], {"pod": "x", "uid": "not-this-one"}) is False
        events.next(W, 1, P.DELETED)
        # The adopted pods are watched as usual.
        assert kubelet.kill(ns, f"elasticdl-{JOB}-worker-0", signal.SIGKILL)
        assert events.next(W, 0, P.FAILED).exit_code == 137
        assert events.of(W, 2) == []  # the stray pod was never this master's
    finally:
        second.shutdown(delete_all=True)
    assert _gone(k8s, f"elasticdl-job-name={JOB},elasticdl-replica-type in (ps,worker)") == []
    # Deleting the Job removes what it owns (the garbage collector; here only its master pod).
    assert k8s.delete_job(master_pod_name(JOB))
    assert _gone(k8s, f"elasticdl-job-name={JOB}") == []
