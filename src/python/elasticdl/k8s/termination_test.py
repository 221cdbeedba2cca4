"""read_termination: pod status (JSON, as the API server sends it) -> phase, exit code, reason."""

import pytest
from elasticdl.k8s.termination import PodTermination, read_termination


def _pod(phase=None, state=None, last_state=None, reason="", message="", conditions=(), **meta):
    status: dict = {}
    if phase:
        status["phase"] = phase
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    if conditions:
        status["conditions"] = list(conditions)
    if state is not None or last_state is not None:
        container = {
            "name": "main",
            "image": "img",
            "imageID": "",
            "ready": False,
            "restartCount": 0,
        }
        if state is not None:
            container["state"] = state
        if last_state is not None:
            container["lastState"] = last_state
        status["containerStatuses"] = [container]
    return {"metadata": {"name": "elasticdl-j-worker-0", **meta}, "status": status}


def _exited(code, reason, message=""):
    terminated = {"exitCode": code, "reason": reason}
    if message:
        terminated["message"] = message
    return {"terminated": terminated}


RUNNING = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
DELETING = {"deletionTimestamp": "2026-01-01T00:01:00Z", "deletionGracePeriodSeconds": 30}
PREEMPTION = {
    "type": "DisruptionTarget",
    "status": "True",
    "reason": "PreemptionByScheduler",
    "message": "Preempted by a pod on node n1",
}

# (case, pod, gone, expected reading)
TABLE = [
    (
        "pending",
        _pod("Pending"),
        False,
        PodTermination("Pending"),
    ),
    (
        "pending, no status yet",
        {"metadata": {"name": "p"}},
        False,
        PodTermination("Pending"),
    ),
    (
        "pending, image not pulled yet",
        _pod("Pending", state={"waiting": {"reason": "ContainerCreating"}}),
        False,
        PodTermination("Pending"),
    ),
    (
        "running",
        _pod("Running", state=RUNNING),
        False,
        PodTermination("Running"),
    ),
    (
        "normal exit 0",
        _pod("Succeeded", state=_exited(0, "Completed")),
        False,
        PodTermination("Succeeded", 0, "Completed"),
    ),
    (
        "exit 1",
        _pod("Failed", state=_exited(1, "Error", "Traceback: ValueError")),
        False,
        PodTermination("Failed", 1, "Error", "Traceback: ValueError"),
    ),
    (
        "OOMKilled",
        _pod("Failed", state=_exited(137, "OOMKilled")),
        False,
        PodTermination("Failed", 137, "OOMKilled"),
    ),
    (
        "SIGKILL 137 without OOM (what preemption looks like from inside)",
        _pod("Failed", state=_exited(137, "Error")),
        False,
        PodTermination("Failed", 137, "Error"),
    ),
    (
        "evicted by the kubelet (node pressure), container killed",
        _pod(
            "Failed",
            state=_exited(137, "Error"),
            reason="Evicted",
            message="The node was low on resource: memory.",
        ),
        False,
        PodTermination("Failed", 137, "Evicted", "The node was low on resource: memory."),
    ),
    (
        "evicted before its container ran",
        _pod("Failed", reason="Evicted", message="The node had condition: [DiskPressure]."),
        False,
        PodTermination("Failed", None, "Evicted", "The node had condition: [DiskPressure]."),
    ),
    (
        "drained (Eviction API): being deleted",
        _pod(
            "Running",
            state=RUNNING,
            conditions=[
                {"type": "Ready", "status": "True"},
                {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"},
            ],
            **DELETING,
        ),
        False,
        PodTermination("Running", None, "Evicted", terminating=True),
    ),
    (
        "preempted by the scheduler: gone, killed after the grace period",
        _pod("Failed", state=_exited(137, "Error"), conditions=[PREEMPTION], **DELETING),
        True,
        PodTermination("Deleted", 137, "Preempted", "Preempted by a pod on node n1"),
    ),
    (
        "preempted by the kubelet for a critical pod",
        _pod(
            "Failed",
            reason="Preempting",
            message="Preempted in order to admit critical pod",
            state=_exited(137, "Error"),
        ),
        False,
        PodTermination("Failed", 137, "Preempted", "Preempted in order to admit critical pod"),
    ),
    (
        "a DisruptionTarget condition that is no longer true changes nothing",
        _pod("Failed", state=_exited(1, "Error"), conditions=[{**PREEMPTION, "status": "False"}]),
        False,
        PodTermination("Failed", 1, "Error"),
    ),
    (
        "deleted while running (kubectl delete): terminating",
        _pod("Running", state=RUNNING, **DELETING),
        False,
        PodTermination("Running", terminating=True),
    ),
    (
        "deleted while running: gone before the container stopped",
        _pod("Running", state=RUNNING, **DELETING),
        True,
        PodTermination("Deleted", None, "Deleted"),
    ),
    (
        "deleted while running: gone after SIGTERM",
        _pod("Failed", state=_exited(143, "Error"), **DELETING),
        True,
        PodTermination("Deleted", 143, "Deleted"),
    ),
    (
        "deleted while pending",
        _pod("Pending"),
        True,
        PodTermination("Deleted", None, "Deleted"),
    ),
    (
        "OOMKilled, then deleted: the cause survives",
        _pod("Failed", state=_exited(137, "OOMKilled"), **DELETING),
        True,
        PodTermination("Deleted", 137, "OOMKilled"),
    ),
    (
        "a pod-level reason: active deadline",
        _pod("Failed", reason="DeadlineExceeded", message="Pod was active too long"),
        False,
        PodTermination("Failed", None, "DeadlineExceeded", "Pod was active too long"),
    ),
    (
        "restarted container (restartPolicy OnFailure) running again: no exit code",
        _pod("Running", state=RUNNING, last_state=_exited(1, "Error")),
        False,
        PodTermination("Running"),
    ),
    (
        "restarted container waiting to run again: its last exit",
        _pod(
            "Running",
            state={"waiting": {"reason": "CrashLoopBackOff"}},
            last_state=_exited(137, "OOMKilled"),
        ),
        False,
        PodTermination("Running", 137, "OOMKilled"),
    ),
    (
        "node lost",
        _pod("Unknown", state=RUNNING, reason="NodeLost"),
        False,
        PodTermination("Unknown", None, "NodeLost"),
    ),
]


@pytest.mark.parametrize("pod, gone, expected", [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_reading(pod, gone, expected):
    assert read_termination(pod, gone=gone) == expected


def test_terminal_phases():
    for phase in ("Pending", "Running", "Unknown"):
        assert not read_termination(_pod(phase)).is_terminal
    assert read_termination(_pod("Succeeded")).is_terminal
    assert read_termination(_pod("Failed")).is_terminal
    assert read_termination(_pod("Running"), gone=True).is_terminal


def test_the_main_container_decides():
    """A sidecar a cluster spec added does not speak for the job's container."""
    pod = _pod("Running")
    pod["status"]["containerStatuses"] = [
        {"name": "sidecar", "state": _exited(2, "Error")},
        {"name": "main", "state": RUNNING},
    ]
    assert read_termination(pod) == PodTermination("Running")
    pod["status"]["containerStatuses"][1]["state"] = _exited(0, "Completed")
    assert read_termination(pod) == PodTermination("Running", 0, "Completed")
    # Pods without a "main" container (not built by ElasticDL): the first that terminated.
    pod["status"]["containerStatuses"] = [
        {"name": "a", "state": RUNNING},
        {"name": "b", "state": _exited(3, "Error")},
    ]
    assert read_termination(pod).exit_code == 3


def test_models_read_like_their_json():
    """The API objects the kubernetes client returns give the same reading as their JSON."""
    pytest.importorskip("kubernetes")
    from elasticdl.k8s.client import to_model

    for case, pod, gone, expected in TABLE:
        model = to_model(pod, "V1Pod")
        assert read_termination(model, gone=gone) == expected, case
