"""How a pod ended, or where it stands until it does: ONE reading of a pod's status.

The client (``elasticdl status`` / ``list``: the master pod and the replica pods) and the
master's :class:`~elasticdl.platform.kubernetes.KubernetesPlatform` (the replica events that
decide relaunches) both read pods through :func:`read_termination`, so for the same pod they
report the same phase, exit code and reason.

The reason names the cause where the pod status shows one, most telling first:

``Preempted``
    the scheduler preempted the pod for a higher-priority one (``DisruptionTarget`` condition
    with reason ``PreemptionByScheduler``), or the kubelet did to admit a critical pod (pod
    reason ``Preempting``);
``OOMKilled``
    the container exceeded its memory limit;
``Evicted``
    the kubelet evicted the pod (node pressure: pod reason ``Evicted``), or it was evicted
    through the Eviction API (``kubectl drain``), by a ``NoExecute`` taint or terminated by the
    kubelet (``DisruptionTarget`` reasons);
the pod's own reason
    e.g. ``DeadlineExceeded``, ``Terminated`` (node shutdown), ``UnexpectedAdmissionError``;
``Deleted``
    the pod is gone and none of the above explains why (``kubectl delete``, the master);
the container's reason
    ``Error`` (any non-zero exit, also a SIGKILL from outside: exit code 137 without
    ``OOMKilled`` is how a preempted process looks to the master), ``Completed`` (exit 0),
    ``ContainerCannotRun``...

The exit code is that of the job's container (``main``; in pods without one, the first
container that terminated), from its current state or, while it is not running, its last one.

Works on the JSON form of a pod (camelCase keys, as ``kubectl get -o json`` prints it) and on
``kubernetes.client`` models, which are converted to it first; the JSON path needs no
``kubernetes`` SDK.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from elasticdl.k8s.names import CONTAINER_NAME

# Pod phases (``status.phase``) and the phase of a pod that is gone.
PENDING = "Pending"
RUNNING = "Running"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
DELETED = "Deleted"
TERMINAL_PHASES = (SUCCEEDED, FAILED, DELETED)

REASON_PREEMPTED = "Preempted"
REASON_OOM_KILLED = "OOMKilled"
REASON_EVICTED = "Evicted"
REASON_ERROR = "Error"
REASON_DELETED = "Deleted"

# What the cluster writes where a pod is disrupted from outside.
DISRUPTION_CONDITION = "DisruptionTarget"
_PREEMPTED_POD_REASONS = ("Preempting",)  # kubelet, admitting a critical pod
_PREEMPTION_CONDITION_REASONS = ("PreemptionByScheduler", "PreemptionByKubeScheduler")
_EVICTION_CONDITION_REASONS = (
    "EvictionByEvictionAPI",
    "DeletionByTaintManager",
    "TerminationByKubelet",
)


@dataclasses.dataclass(frozen=True)
class PodTermination:
    """What :func:`read_termination` reads from one pod."""

    # The pod's phase (Pending, Running, Succeeded, Failed, Unknown), or Deleted once it is gone.
    phase: str
    exit_code: int | None = None  # the container's, once it terminated
    reason: str = ""  # the cause, see the module docstring; "" while nothing ended
    message: str = ""  # for humans: the container's termination message or the pod's
    terminating: bool = False  # deletion requested (deletionTimestamp), the pod still exists

    @property
    def is_terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES


def read_termination(pod: Any, gone: bool = False) -> PodTermination:
    """Read ``pod`` (a ``V1Pod`` or its JSON dict). ``gone``: the pod no longer exists (a watch
    reported it ``DELETED``); its last known status still tells how it ended."""
    data = pod if isinstance(pod, dict) else _to_dict(pod)
    metadata = data.get("metadata") or {}
    status = data.get("status") or {}
    terminated = _container_termination(status)
    disruption = _disruption(status)
    pod_reason, pod_message = status.get("reason") or "", status.get("message") or ""
    term_reason, term_message = terminated.get("reason") or "", terminated.get("message") or ""
    cut_reason, cut_message = disruption.get("reason") or "", disruption.get("message") or ""

    if pod_reason in _PREEMPTED_POD_REASONS or cut_reason in _PREEMPTION_CONDITION_REASONS:
        reason, message = REASON_PREEMPTED, pod_message or cut_message
    elif term_reason == REASON_OOM_KILLED:
        reason, message = REASON_OOM_KILLED, term_message
    elif pod_reason == REASON_EVICTED or cut_reason in _EVICTION_CONDITION_REASONS:
        reason, message = REASON_EVICTED, pod_message or cut_message
    elif pod_reason:
        reason, message = pod_reason, pod_message
    elif gone:
        reason, message = REASON_DELETED, ""
    else:
        reason, message = term_reason, term_message
    exit_code = terminated.get("exitCode")
    return PodTermination(
        phase=DELETED if gone else (status.get("phase") or PENDING),
        exit_code=int(exit_code) if exit_code is not None else None,
        reason=reason,
        message=message or term_message or pod_message or cut_message,
        terminating=bool(metadata.get("deletionTimestamp")) and not gone,
    )


def _to_dict(pod: Any) -> dict:
    from elasticdl.k8s.client import to_dict

    return to_dict(pod) or {}


def _container_termination(status: dict) -> dict:
    """The ``terminated`` state of the job's container (``main``; in pods without one, the
    first container that terminated), or its last one while it is not running (restarted,
    waiting); ``{}`` if none."""
    statuses = status.get("containerStatuses") or []
    main = [cs for cs in statuses if cs.get("name") == CONTAINER_NAME]
    for cs in main or statuses:
        state = cs.get("state") or {}
        if state.get("terminated"):
            return state["terminated"]
        last = (cs.get("lastState") or {}).get("terminated")
        if last and not state.get("running"):
            return last
    return {}


def _disruption(status: dict) -> dict:
    for condition in status.get("conditions") or []:
        if condition.get("type") == DISRUPTION_CONDITION and condition.get("status") == "True":
            return condition
    return {}
