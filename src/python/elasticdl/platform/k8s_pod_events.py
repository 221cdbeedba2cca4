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

Not thread-safe by itself: the platform serialises calls under its own lock, so that the watch
and ``adopt()`` see one sequence of states.
"""

from __future__ import annotations

import dataclasses

from elasticdl.k8s.names import LABEL_REPLICA_INDEX, LABEL_REPLICA_TYPE
from elasticdl.k8s.termination import read_termination
from elasticdl.platform.base import (
    REASON_DELETED_BY_MASTER,
    REASON_NODE_LOST,
    ReplicaEvent,
    ReplicaPhase,
    ReplicaType,
)


@dataclasses.dataclass
class PodState:
    """What the translator already told the listeners about one pod (by uid)."""

    replica_type: ReplicaType
    replica_id: int
    phase: ReplicaPhase | None = None
    terminal: bool = False


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

    def _forget(self, uid: str) -> None:
        self._states.pop(uid, None)
        self._deleted_by_master.discard(uid)
        self._node_lost.discard(uid)
