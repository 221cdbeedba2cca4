"""KubernetesPlatform's replica events and the client's job status, read from the same pods
through a fake API (the real API server: tests/python/elasticdl_tests/k8s/)."""

from __future__ import annotations

import re
import threading

import pytest

pytest.importorskip("kubernetes")

from elasticdl.jobs.k8s_backend import KubernetesBackend  # noqa: E402
from elasticdl.k8s import names  # noqa: E402
from elasticdl.k8s import termination  # noqa: E402
from elasticdl.k8s.client import to_model  # noqa: E402
from elasticdl.platform import base  # noqa: E402
from elasticdl.platform.base import ReplicaPhase, ReplicaType  # noqa: E402
from elasticdl.platform.kubernetes import KubernetesPlatform  # noqa: E402

JOB = "ev"
W = ReplicaType.WORKER


class _FakeK8s:
    """The part of K8sClient the platform and the backend use, over a dict of pods."""

    namespace = "ns"

    def __init__(self) -> None:
        self.pods: dict[str, object] = {}
        self.deleted: list[str] = []

    def get_pod(self, name):
        return self.pods.get(name)

    def list_pods(self, label_selector: str = ""):
        return [p for p in self.pods.values() if _matches(label_selector, p.metadata.labels)]

    def delete_pod(self, name, grace_seconds=None, propagation=None):
        self.deleted.append(name)
        return name in self.pods

    def watch_pods(self, label_selector, stop: threading.Event, timeout_seconds=30):
        stop.wait()  # events are fed to _translate by the tests
        return
        yield


def _matches(selector: str, labels: dict) -> bool:
    for key, values in re.findall(r"([\w.-]+) in \(([^)]*)\)", selector):
        if labels.get(key) not in values.split(","):
            return False
    for key, value in re.findall(r"([\w.-]+)=([\w.-]+)", selector):
        if labels.get(key) != value:
            return False
    return True


def _pod(replica_type, replica_id, phase, state=None, uid=None, reason="", conditions=(), **meta):
    name = (
        names.master_pod_name(JOB)
        if replica_type == names.MASTER_TYPE
        else names.pod_name(JOB, replica_type, replica_id)
    )
    status = {"phase": phase}
    if reason:
        status["reason"] = reason
    if conditions:
        status["conditions"] = list(conditions)
    if state:
        status["containerStatuses"] = [
            {"name": "main", "image": "img", "imageID": "", "ready": False, "restartCount": 0}
            | {"state": state}
        ]
    data = {
        "metadata": {
            "name": name,
            "uid": uid or f"uid-{name}",
            "labels": names.job_labels(JOB, replica_type, replica_id),
            **meta,
        },
        "status": status,
    }
    return to_model(data, "V1Pod")


def _exited(code, reason):
    return {"terminated": {"exitCode": code, "reason": reason}}


RUNNING = {"running": {}}
DELETING = {"deletionTimestamp": "2026-01-01T00:00:00Z"}
PREEMPTED = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}


@pytest.fixture
def k8s():
    return _FakeK8s()


@pytest.fixture
def platform(k8s):
    platform = KubernetesPlatform(JOB, k8s, image="img")
    try:
        yield platform
    finally:
        platform.shutdown(delete_all=False)


def _events(platform, *changes):
    events = [platform._translate(kind, pod) for kind, pod in changes]
    return [e for e in events if e is not None]


def test_lifecycle_one_terminal_event(platform):
    events = _events(
        platform,
        ("ADDED", _pod("worker", 0, "Pending")),
        ("MODIFIED", _pod("worker", 0, "Pending")),
        ("MODIFIED", _pod("worker", 0, "Running", RUNNING)),
        ("MODIFIED", _pod("worker", 0, "Failed", _exited(137, "OOMKilled"))),
        ("DELETED", _pod("worker", 0, "Failed", _exited(137, "OOMKilled"))),
    )
    assert [e.phase for e in events] == [ReplicaPhase.PENDING, ReplicaPhase.RUNNING, "Failed"]
    oom = events[-1]
    assert (oom.exit_code, oom.reason, oom.looks_preempted) == (137, "OOMKilled", False)


def test_sigkill_without_oom_looks_preempted(platform):
    (failed,) = _events(platform, ("MODIFIED", _pod("worker", 1, "Failed", _exited(137, "Error"))))
    assert (failed.phase, failed.exit_code, failed.reason) == ("Failed", 137, "Error")
    assert failed.looks_preempted


def test_unknown_phase_waits(platform):
    assert _events(platform, ("MODIFIED", _pod("worker", 0, "Unknown", RUNNING))) == []


def test_deleted_by_someone_else_and_by_the_master(platform, k8s):
    # kubectl delete: the pod fails with SIGTERM while it is being deleted; one Deleted event.
    # Only something outside sends a worker SIGTERM (here a person, as a preempting scheduler
    # whose Event was lost would): stopped from outside, like a SIGKILL.
    (deleted,) = _events(
        platform,
        ("MODIFIED", _pod("worker", 0, "Failed", _exited(143, "Error"), **DELETING)),
        ("DELETED", _pod("worker", 0, "Failed", _exited(143, "Error"), **DELETING)),
    )
    assert (deleted.phase, deleted.exit_code, deleted.reason) == ("Deleted", 143, "Deleted")
    assert deleted.looks_preempted
    # The scheduler preempting the pod for a higher-priority one.
    (preempted,) = _events(
        platform,
        ("DELETED", _pod("worker", 1, "Running", RUNNING, conditions=[PREEMPTED], **DELETING)),
    )
    assert (preempted.phase, preempted.reason) == ("Deleted", "Preempted")
    assert preempted.looks_preempted
    # The master's own delete().
    k8s.pods[names.pod_name(JOB, "worker", 2)] = _pod("worker", 2, "Running", RUNNING)
    platform.delete(W, 2)
    (by_master,) = _events(platform, ("DELETED", _pod("worker", 2, "Running", RUNNING)))
    assert by_master.reason == base.REASON_DELETED_BY_MASTER


# Terminal replica pods: the event the master acts on and what `elasticdl status` shows agree.
AGREEMENT = [
    ("Succeeded", _exited(0, "Completed"), "", ()),
    ("Failed", _exited(1, "Error"), "", ()),
    ("Failed", _exited(137, "OOMKilled"), "", ()),
    ("Failed", _exited(137, "Error"), "", ()),
    ("Failed", _exited(137, "Error"), "Evicted", ()),
    ("Failed", None, "Evicted", ()),
    ("Failed", _exited(137, "Error"), "", [PREEMPTED]),
]


def test_client_and_master_read_the_same(k8s, platform):
    events = {}
    for i, (phase, state, reason, conditions) in enumerate(AGREEMENT):
        pod = _pod("worker", i, phase, state, reason=reason, conditions=conditions)
        k8s.pods[pod.metadata.name] = pod
        (events[i],) = _events(platform, ("MODIFIED", pod))
    replicas = KubernetesBackend(namespace="ns", k8s=k8s)._replicas(JOB)
    assert [(r.id, r.phase, r.exit_code, r.message) for r in replicas] == [
        (i, str(e.phase), e.exit_code, e.reason) for i, e in sorted(events.items())
    ]
    assert [e.reason for _, e in sorted(events.items())] == [
        "Completed",
        "Error",
        "OOMKilled",
        "Error",
        "Evicted",
        "Evicted",
        "Preempted",
    ]


def test_master_failure_message(k8s):
    backend = KubernetesBackend(namespace="ns", k8s=k8s)
    k8s.pods[names.master_pod_name(JOB)] = _pod("master", 0, "Failed", _exited(137, "OOMKilled"))
    status = backend.status(JOB)
    assert (status.phase, status.message) == ("Failed", "master exited with 137 (OOMKilled)")
    k8s.pods[names.master_pod_name(JOB)] = _pod(
        "master", 0, "Failed", reason="Evicted", conditions=()
    )
    k8s.pods[names.master_pod_name(JOB)].status.message = "The node was low on resource: memory."
    assert backend.status(JOB).message == "Evicted: The node was low on resource: memory."


def test_reasons_are_the_platform_contracts():
    """The causes the master acts on are spelled as the platform contract spells them."""
    assert termination.REASON_OOM_KILLED == base.REASON_OOM_KILLED
    assert termination.REASON_PREEMPTED == base.REASON_PREEMPTED
    assert termination.REASON_ERROR == base.REASON_ERROR


def test_host_network_servers_listen_on_the_pod_ip_only(k8s):
    """In host network mode the replicas' servers share the node's interfaces: they bind the
    pod (= node) IP, never every interface; in the pod network they bind all of the pod's."""
    host = KubernetesPlatform(JOB, k8s, image="img", network="host", master_host="127.0.0.1")
    pod = KubernetesPlatform(JOB, k8s, image="img", master_host="10.1.2.3")
    try:
        assert (host.traits.bind_host, host.traits.port_may_be_taken) == ("127.0.0.1", True)
        assert (pod.traits.bind_host, pod.traits.port_may_be_taken) == ("0.0.0.0", False)
    finally:
        host.shutdown(delete_all=False)
        pod.shutdown(delete_all=False)


UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/2 nodes are available: 2 Insufficient cpu.",
}


def test_a_pending_pod_reports_the_schedulers_reason_with_each_change(platform):
    fewer = dict(UNSCHEDULABLE, message="0/2 nodes are available: 1 Insufficient cpu.")
    events = _events(
        platform,
        ("ADDED", _pod("worker", 0, "Pending")),
        ("MODIFIED", _pod("worker", 0, "Pending", conditions=[UNSCHEDULABLE])),
        ("MODIFIED", _pod("worker", 0, "Pending", conditions=[UNSCHEDULABLE])),  # no change
        ("MODIFIED", _pod("worker", 0, "Pending", conditions=[fewer])),
        ("MODIFIED", _pod("worker", 0, "Running", RUNNING)),
    )
    assert [(e.phase, e.reason, e.message) for e in events] == [
        (ReplicaPhase.PENDING, "", ""),
        (ReplicaPhase.PENDING, "Unschedulable", UNSCHEDULABLE["message"]),
        (ReplicaPhase.PENDING, "Unschedulable", fewer["message"]),
        (ReplicaPhase.RUNNING, "", ""),
    ]


def _event(reason, message, when="2026-01-01T00:00:01Z", source="default-scheduler"):
    return {
        "reason": reason,
        "message": message,
        "lastTimestamp": when,
        "source": {"component": source},
    }


def test_the_cause_of_an_end_from_outside_is_read_from_the_pods_events():
    from elasticdl.platform.k8s_pod_events import cause_of_events

    assert cause_of_events([]) == ("", "")
    assert cause_of_events([_event("Scheduled", "assigned to n1")]) == ("", "")
    preempted = _event("Preempted", "Preempted by default/online-0 on node n1")
    assert cause_of_events([_event("Started", "x"), preempted]) == (
        "Preempted",
        "Preempted by default/online-0 on node n1",
    )
    evicted = _event(
        "TaintManagerEviction", "Marking for deletion Pod ns/p", "2026-01-01T00:00:09Z"
    )
    assert cause_of_events([preempted, evicted])[0] == "Evicted"  # the newest telling one
    assert cause_of_events([_event("Evicted", "The node was low on resource: memory.")])[0] == (
        "Evicted"
    )


def test_a_pod_being_deleted_by_someone_else_ends_once_its_events_say_why(platform, k8s):
    # Its node is lost: the taint manager deleted it, and it stays Terminating (no kubelet).
    (running,) = _events(platform, ("ADDED", _pod("worker", 3, "Running", RUNNING)))
    uid = f"uid-{names.pod_name(JOB, 'worker', 3)}"
    assert _events(platform, ("MODIFIED", _pod("worker", 3, "Running", RUNNING, **DELETING))) == []
    assert platform._suspects == {uid: names.pod_name(JOB, "worker", 3)}
    ended = platform._pod_events.ended_by(uid, "Evicted", "Marking for deletion Pod ns/p")
    assert (ended.phase, ended.reason, ended.replica_id) == (ReplicaPhase.DELETED, "Evicted", 3)
    # One terminal event per pod: its later changes and its deletion say nothing more.
    assert platform._pod_events.ended_by(uid, "Evicted", "") is None
    assert _events(platform, ("DELETED", _pod("worker", 3, "Running", RUNNING, **DELETING))) == []
    # A pod the master deletes is no suspect.
    k8s.pods[names.pod_name(JOB, "worker", 4)] = _pod("worker", 4, "Running", RUNNING)
    _events(platform, ("ADDED", _pod("worker", 4, "Running", RUNNING)))
    platform.delete(W, 4)
    _events(platform, ("MODIFIED", _pod("worker", 4, "Running", RUNNING, **DELETING)))
    assert f"uid-{names.pod_name(JOB, 'worker', 4)}" not in platform._suspects


def test_a_pods_events_are_those_naming_it_and_its_evictions_naming_only_its_name():
    """Events are listed by the pod's name: the taint manager's eviction names no uid (Kubernetes
    1.20's ``emitPodDeletionEvent``) and counts if recorded since the pod was created; an Event
    naming another uid is another pod's of the same name (a relaunched ``ps-0``)."""
    from datetime import datetime, timezone

    from elasticdl.platform.k8s_pod_events import cause_of_events, events_of_pod

    def about(uid, event):
        return {
            **event,
            "involvedObject": {"kind": "Pod", "name": "p", **({"uid": uid} if uid else {})},
        }

    created = datetime(2026, 1, 1, 0, 0, 5, tzinfo=timezone.utc)
    eviction = _event(
        "TaintManagerEviction", "Marking for deletion Pod ns/p", "2026-01-01T00:00:09Z"
    )
    earlier = _event(
        "TaintManagerEviction", "Marking for deletion Pod ns/p", "2026-01-01T00:00:01Z"
    )
    preempted_other = _event("Preempted", "by ns/high on node n1", "2026-01-01T00:00:09Z")
    mine = events_of_pod([about("", eviction)], "u1", created)
    assert cause_of_events(mine) == ("Evicted", "Marking for deletion Pod ns/p")
    assert events_of_pod([about("", earlier), about("u0", preempted_other)], "u1", created) == []
    assert (
        len(events_of_pod([about("u1", _event("Preempted", "x")), about("", eviction)], "u1", None))
        == 2
    )


class _WatchedK8s(_FakeK8s):
    """Feeds the platform's watch the given changes, and answers the Events of a pod (an
    eviction by the taint manager, which names the pod but no uid) by field selector."""

    def __init__(self, changes) -> None:
        super().__init__()
        self.changes = list(changes)
        self.owned = threading.Event()
        self.selectors: list[str] = []
        self.core = self

    def watch_pods(self, label_selector, stop: threading.Event, timeout_seconds=30):
        self.owned.wait(10)
        yield from self.changes
        stop.wait()

    def list_namespaced_event(self, namespace, field_selector=""):
        self.selectors.append(field_selector)
        eviction = _event("TaintManagerEviction", "Marking for deletion Pod ns/p")
        eviction["involvedObject"] = {"kind": "Pod", "name": names.pod_name(JOB, "worker", 5)}
        return type("EventList", (), {"items": [eviction]})()


def test_a_gone_pods_events_are_read_by_its_name_and_then_it_is_forgotten():
    """The watch's last word on a pod (DELETED) still finds its Events by the pod's name; once
    that event is handled the platform keeps nothing of the pod (a long job's pods come and go
    by the thousand)."""
    name, uid = names.pod_name(JOB, "worker", 5), "uid-w5"
    gone = _pod("worker", 5, "Failed", _exited(143, "Error"), uid=uid, **DELETING)
    k8s = _WatchedK8s(
        [("ADDED", _pod("worker", 5, "Running", RUNNING, uid=uid)), ("DELETED", gone)]
    )
    platform = KubernetesPlatform(JOB, k8s, image="img")
    seen, handled = [], threading.Event()
    platform.add_event_listener(lambda e: (seen.append(e), e.phase.is_terminal and handled.set()))
    try:
        platform._own((W, 5), uid)
        k8s.owned.set()
        assert handled.wait(10), seen
        assert (seen[-1].phase, seen[-1].reason) == (ReplicaPhase.DELETED, "Evicted")
        assert k8s.selectors == [f"involvedObject.name={name}"]
        for _ in range(100):  # the forgetting is queued after the event
            if not platform._identity:
                break
            handled.wait(0.05)
        assert platform._identity == {}
    finally:
        platform.shutdown(delete_all=False)


# ---- changing the PS count (master.ps_rescale) ----------------------------------------------
class _ServicesK8s(_FakeK8s):
    def __init__(self) -> None:
        super().__init__()
        self.deleted_services: list[str] = []
        self.services: list[str] = []

    def delete_service(self, name):
        self.deleted_services.append(name)
        return True

    def create_pod(self, pod):
        pod.metadata.uid = f"uid-{pod.metadata.name}"
        self.pods[pod.metadata.name] = pod
        return pod

    def create_service(self, service):
        self.services.append(service.metadata.name)

    def annotate_pod(self, name, annotations):
        pod = self.pods.get(name)
        if pod is None:
            return False
        pod.metadata.annotations = {**(pod.metadata.annotations or {}), **annotations}
        return True


def test_a_retired_ps_id_loses_its_service():
    k8s = _ServicesK8s()
    platform = KubernetesPlatform(JOB, k8s, image="img")
    try:
        platform.retire(ReplicaType.PS, 2)
    finally:
        platform.shutdown(delete_all=False)
    assert k8s.deleted_services == [names.pod_name(JOB, "ps", 2)]


@pytest.mark.parametrize(
    "volume, path, shared",
    [
        ("", "/ckpt", False),
        ("claim_name=c,mount_path=/data", "/data/ckpt", True),
        ("claim_name=c,mount_path=/data/", "/data", True),
        ("claim_name=c,mount_path=/data", "/database/ckpt", False),
        ("claim_name=c,mount_path=/data,read_only=true", "/data/ckpt", False),
        ("host_path=/mnt/nfs,mount_path=/ckpt", "/ckpt/job", True),
    ],
)
def test_the_checkpoint_dir_must_be_on_a_volume_every_ps_pod_mounts(k8s, volume, path, shared):
    from elasticdl.k8s.pods import PodTemplate

    platform = KubernetesPlatform(JOB, k8s, image="img", template=PodTemplate("ns", volume=volume))
    try:
        problem = platform.shared_dir_problem(path)
    finally:
        platform.shutdown(delete_all=False)
    assert (problem == "") == shared
    if not shared:
        assert "--checkpoint_dir" in problem and "--volume" in problem and "\n" not in problem


def test_the_client_writes_on_the_master_pod_what_the_master_reads():
    k8s = _ServicesK8s()
    k8s.pods[names.master_pod_name(JOB)] = _pod(names.MASTER_TYPE, 0, "Running")
    platform = KubernetesPlatform(JOB, k8s, image="img")
    try:
        assert platform.traits.requests_on_master
        k8s.annotate_pod(names.master_pod_name(JOB), {"elasticdl.org/ps-count-request": "x"})
        assert platform.master_annotations()["elasticdl.org/ps-count-request"] == "x"
        assert platform.annotate_master({"elasticdl.org/ps-count-outcome": "y"})
        assert platform.master_annotations()["elasticdl.org/ps-count-outcome"] == "y"
    finally:
        platform.shutdown(delete_all=False)


def test_scale_ps_on_a_job_that_does_not_run_writes_nothing(k8s):
    from elasticdl.jobs.errors import ClientError

    k8s = _ServicesK8s()
    k8s.pods[names.master_pod_name(JOB)] = _pod("master", 0, "Failed", _exited(1, "Error"))
    with pytest.raises(ClientError, match="can change only while it runs"):
        KubernetesBackend(namespace="ns", k8s=k8s).scale_ps(JOB, 2)
    assert not (k8s.pods[names.master_pod_name(JOB)].metadata.annotations or {})


def test_each_ps_of_a_new_set_mounts_the_jobs_volumes_and_gets_its_service():
    from elasticdl.common.job_spec import spec_from_values
    from elasticdl.k8s.pods import PodTemplate
    from elasticdl.master.launch_specs import Checkpointing, LaunchSpecs, ReplicaContext

    k8s = _ServicesK8s()
    volume = "claim_name=c,mount_path=/shared"
    platform = KubernetesPlatform(JOB, k8s, image="img", template=PodTemplate("ns", volume=volume))
    job = spec_from_values(
        "train",
        {"job_name": JOB, "model_def": "m.f", "training_data": "/d", "num_ps_pods": 1},
    )
    specs = LaunchSpecs(
        job, platform, ReplicaContext("m:1", checkpointing=Checkpointing("/shared/ckpt", 10))
    )
    try:
        assert platform.shared_dir_problem("/shared/ckpt") == ""
        specs.set_ps_generation(1, 3)
        for ps_id in range(3):
            platform.launch(specs.ps(ps_id))
    finally:
        platform.shutdown(delete_all=False)
    for ps_id in range(3):
        pod = k8s.pods[names.pod_name(JOB, "ps", ps_id)]
        mounts = {m.mount_path: m.name for m in pod.spec.containers[0].volume_mounts}
        claims = {v.name: v.persistent_volume_claim for v in pod.spec.volumes}
        assert claims[mounts["/shared"]].claim_name == "c"
        argv = " ".join(pod.spec.containers[0].command + (pod.spec.containers[0].args or []))
        assert "--num_ps_pods=3" in argv or "--num_ps_pods 3" in argv, argv
    assert k8s.services == [names.pod_name(JOB, "ps", i) for i in range(3)]
