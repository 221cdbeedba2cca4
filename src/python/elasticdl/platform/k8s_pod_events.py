"""Pod changes of a job's watch -> replica events, the rule the master's relaunch logic relies
on: an event per change of phase, and exactly ONE terminal event per pod.

* A pod that ended (``Succeeded``/``Failed``) reports it once; its later changes and its
  deletion say nothing more.
* A pod deleted before it ended reports ``Deleted``, with ``DeletedByMaster`` as the reason
  when the master itself deleted it (:meth:`PodEventTranslator.deleted_by_master`), so the
  master does not relaunch what it meant to stop.
* A pod being deleted that looks ended waits for its ``DELETED`` event: that is its final word.
* A pod removed because its node stopped answering (:meth:`PodEventTranslator.node_lost`)
  reports ``Deleted`` with the reason ``NodeLost``.
* ``Unknown`` (the node stopped reporting) is no answer: the translator waits for one.
* A ``Pending`` pod the scheduler cannot place (condition ``PodScheduled=False``) reports
  ``Pending`` again whenever the scheduler's reason or message changes (``Unschedulable``,
  "0/2 nodes are available: 2 Insufficient cpu.").
* Who ended a pod from outside is often only in its Events, not in its status (a scheduler
  preempting it, the taint manager evicting it from a lost node: both just delete it):
  :func:`cause_of_events` reads them, and :meth:`PodEventTranslator.ended_by` ends a pod
  being deleted for such a cause at once, without waiting for a ``DELETED`` that a lost
  node's kubelet never makes happen.

Not thread-safe by itself: the platform serialises calls under its own lock, so that the watch
and ``adopt()`` see one sequence of states.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any, Iterable

from elasticdl.k8s.names import LABEL_REPLICA_INDEX, LABEL_REPLICA_TYPE
from elasticdl.k8s.termination import REASON_EVICTED, read_termination
from elasticdl.platform.base import (
    REASON_DELETED_BY_MASTER,
    REASON_NODE_LOST,
    REASON_PREEMPTED,
    ReplicaEvent,
    ReplicaPhase,
    ReplicaType,
)

# Event reasons -> the cause a replica event carries. The scheduler records "Preempted" on a
# pod it deletes for a higher-priority one; the node lifecycle controller's taint manager
# "TaintManagerEviction" on a pod it deletes from a NoExecute-tainted (lost) node; the
# kubelet "Evicted" on a pod it evicts for node pressure.
EVENT_CAUSES = {
    "Preempted": REASON_PREEMPTED,
    "TaintManagerEviction": REASON_EVICTED,
    "Evicted": REASON_EVICTED,
}
# Causes the master treats as "ended from outside, not the replica's fault".
OUTSIDE_CAUSES = (REASON_PREEMPTED, REASON_EVICTED)
POD_SCHEDULED = "PodScheduled"


def events_of_pod(events: Iterable[Any], uid: str, created: Any) -> list[dict]:
    """The Events about pod ``uid`` among ``events`` listed by its name (``V1Event`` objects
    or their JSON dicts): those naming its uid, and those naming none recorded since it was
    ``created`` (the taint manager's evictions name only the pod's namespace and name; one
    recorded before belonged to an earlier pod of the same name)."""
    since = _instant(created)
    found = []
    for event in events:
        data = event if isinstance(event, dict) else _to_dict(event)
        about = (data.get("involvedObject") or {}).get("uid") or ""
        when = _instant(_recorded(data))
        if about == uid or not about and (since is None or when is not None and when >= since):
            found.append(data)
    return found


def _recorded(data: dict) -> str:
    return str(
        data.get("lastTimestamp")
        or data.get("eventTime")
        or (data.get("metadata") or {}).get("creationTimestamp")
        or ""
    )


def _instant(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value)) if value else None
    except ValueError:
        return None


def cause_of_events(events: Iterable[Any]) -> tuple[str, str]:
    """``(cause, message)`` from a pod's Events (``V1Event`` objects or their JSON dicts),
    the newest telling one; ``("", "")`` if none tells."""
    found: list[tuple[str, str, str]] = []
    for event in events:
        data = event if isinstance(event, dict) else _to_dict(event)
        cause = EVENT_CAUSES.get(data.get("reason") or "")
        if cause:
            found.append((_recorded(data), cause, data.get("message") or data.get("note") or ""))
    if not found:
        return "", ""
    _, cause, message = max(found)
    return cause, message


def unschedulable(pod: Any) -> tuple[str, str]:
    """``(reason, message)`` of a Pending pod's ``PodScheduled=False`` condition, or
    ``("", "")``."""
    data = pod if isinstance(pod, dict) else _to_dict(pod)
    status = data.get("status") or {}
    if (status.get("phase") or "Pending") != "Pending":
        return "", ""
    for condition in status.get("conditions") or []:
        if condition.get("type") == POD_SCHEDULED and condition.get("status") == "False":
            return condition.get("reason") or "", condition.get("message") or ""
    return "", ""


def _to_dict(obj: Any) -> dict:
    from elasticdl.k8s.client import to_dict

    return to_dict(obj) or {}


@dataclasses.dataclass
class PodState:
    """What the translator already told the listeners about one pod (by uid)."""

    replica_type: ReplicaType
    replica_id: int
    phase: ReplicaPhase | None = None
    terminal: bool = False
    waiting: tuple[str, str] = ("", "")  # why the scheduler cannot place it, last reported


class PodEventTranslator:
    def __init__(self) -> None:
        self._states: dict[str, PodState] = {}  # pod uid -> state
        self._deleted_by_master: set[str] = set()  # pod uids
        self._node_lost: set[str] = set()  # pod uids

    def deleted_by_master(self, uid: str) -> None:
        """The master is deleting this pod: its ``Deleted`` event says so."""
        self._deleted_by_master.add(uid)

    def node_lost(self, uid: str) -> None:
        """This pod's node does not answer and the pod is being removed without it."""
        self._node_lost.add(uid)

    def adopted(self, uid: str, key: tuple[ReplicaType, int], phase: ReplicaPhase) -> None:
        """A pod taken over in ``phase`` (read by the adopter, who reports it)."""
        state = self._states.setdefault(uid, PodState(*key))
        state.phase, state.terminal = phase, phase.is_terminal

    def translate(self, kind: str, pod) -> ReplicaEvent | None:
        """The event a watch change (``kind``: ADDED / MODIFIED / DELETED) of ``pod`` means
        to the master, or None when it means nothing new."""
        labels = pod.metadata.labels or {}
        try:
            replica_type = ReplicaType(labels.get(LABEL_REPLICA_TYPE, ""))
            replica_id = int(labels.get(LABEL_REPLICA_INDEX, ""))
        except ValueError:
            return None
        uid = pod.metadata.uid
        gone = kind == "DELETED"
        state = self._states.setdefault(uid, PodState(replica_type, replica_id))
        if state.terminal:
            if gone:
                self._forget(uid)
            return None
        reading = read_termination(pod, gone=gone)
        if gone:
            by_master = uid in self._deleted_by_master
            lost = uid in self._node_lost
            self._forget(uid)
            if by_master:
                reason, message = REASON_DELETED_BY_MASTER, "pod deleted by the master"
            elif lost:
                reason = REASON_NODE_LOST
                message = f"its node {pod.spec.node_name} stopped answering"
            else:
                reason, message = reading.reason, "pod deleted"
            return ReplicaEvent(
                replica_type,
                replica_id,
                ReplicaPhase.DELETED,
                exit_code=reading.exit_code,
                reason=reason,
                message=(reading.message if not lost else "") or message,
            )
        try:
            phase = ReplicaPhase(reading.phase)
        except ValueError:  # "Unknown": node lost; wait for a definite answer
            return None
        if phase == ReplicaPhase.PENDING:
            waiting = unschedulable(pod)
            if phase == state.phase and waiting == state.waiting:
                return None
            state.phase, state.waiting = phase, waiting
            return ReplicaEvent(
                replica_type, replica_id, phase, reason=waiting[0], message=waiting[1]
            )
        if phase == state.phase:
            return None
        if phase.is_terminal and reading.terminating:
            # Being deleted: the final word is the DELETED event (one terminal event per pod).
            return None
        state.phase = phase
        if not phase.is_terminal:
            return ReplicaEvent(replica_type, replica_id, phase)
        state.terminal = True
        return ReplicaEvent(
            replica_type,
            replica_id,
            phase,
            exit_code=reading.exit_code,
            reason=reading.reason,
            message=reading.message,
        )

    def ends_from_outside(self, uid: str) -> bool:
        """Whether the pod ``uid`` is one whose end is still to be reported and that the master
        did not delete (so its Events may tell who did)."""
        state = self._states.get(uid)
        return state is not None and not state.terminal and uid not in self._deleted_by_master

    def ended_by(self, uid: str, cause: str, message: str) -> ReplicaEvent | None:
        """The pod ``uid``, being deleted, was ended from outside for ``cause`` (read from its
        Events): its terminal event now (``Deleted`` with that reason), or None when its end
        was already reported."""
        if not self.ends_from_outside(uid):
            return None
        state = self._states[uid]
        state.terminal = True
        return ReplicaEvent(
            state.replica_type,
            state.replica_id,
            ReplicaPhase.DELETED,
            reason=cause,
            message=message or f"pod deleted: {cause}",
        )

    def _forget(self, uid: str) -> None:
        self._states.pop(uid, None)
        self._deleted_by_master.discard(uid)
        self._node_lost.discard(uid)
