"""Pods whose node stopped answering: deleted, but never gone.

A pod is removed from the API only when its kubelet confirms that its containers stopped (or
someone deletes it with no grace). When the node dies, the node controller evicts its pods
after their tolerations (``--node_lost_timeout``), but nothing confirms: the pods stay
``Terminating`` until the node comes back, which may be never. Their replicas would never end
for the master (no ``DELETED`` event: no relaunch, the tasks of a worker held) and a PS could
not be started again under its name.

So a pod of the job that is still there ``margin`` seconds after its deletion deadline
(``metadata.deletionTimestamp``: the time of the delete plus the pod's grace period, by which
a live kubelet has stopped it) is force-deleted here. If the node does come back, its kubelet
finds the pod gone from the API and kills the containers that were left.
"""

from __future__ import annotations

import datetime
import logging
import threading
from typing import Callable

from elasticdl.k8s.client import K8sApiError, K8sClient

logger = logging.getLogger(__name__)

# Beyond the deadline a live kubelet meets (it also waits for the API to confirm).
DEFAULT_MARGIN_SECONDS = 15.0
_SWEEP_SECONDS = 2.0


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


class LostPodReaper:
    def __init__(
        self,
        k8s: K8sClient,
        stop: threading.Event,
        margin_seconds: float = DEFAULT_MARGIN_SECONDS,
        clock: Callable[[], datetime.datetime] = _now,
        on_lost: Callable[[str], None] = lambda uid: None,
    ) -> None:
        """``on_lost(uid)``: called before a pod is force-deleted (its ``DELETED`` event
        follows), outside this reaper's lock."""
        self._k8s = k8s
        self._stop = stop
        self._margin = datetime.timedelta(seconds=margin_seconds)
        self._clock = clock
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._deadlines: dict[str, tuple[str, datetime.datetime]] = {}  # uid -> (name, deadline)
        self.force_deleted: list[str] = []  # pod names, for logs and tests
        self._thread = threading.Thread(target=self._run, name="k8s-lost-pods", daemon=True)
        self._thread.start()

    def saw(self, kind: str, pod) -> None:
        """A watch change of one of the job's pods."""
        uid, deadline = pod.metadata.uid, pod.metadata.deletion_timestamp
        with self._lock:
            if kind == "DELETED" or deadline is None:
                self._deadlines.pop(uid, None)
            else:
                if deadline.tzinfo is None:
                    deadline = deadline.replace(tzinfo=datetime.timezone.utc)
                self._deadlines[uid] = (pod.metadata.name, deadline)

    def due(self) -> list[tuple[str, str]]:
        """(uid, name) of the pods past their deadline and the margin."""
        now = self._clock()
        with self._lock:
            return [
                (uid, name)
                for uid, (name, deadline) in self._deadlines.items()
                if now >= deadline + self._margin
            ]

    def sweep(self) -> None:
        for uid, name in self.due():
            try:
                pod = self._k8s.get_pod(name)
                if pod is None or pod.metadata.uid != uid:
                    with self._lock:
                        self._deadlines.pop(uid, None)
                    continue
                node = pod.spec.node_name or "?"
                logger.warning(
                    "pod %s is still there %.0fs after its deletion deadline: its node %s does "
                    "not answer; deleting it without grace so that its replica can be replaced",
                    name,
                    self._margin.total_seconds(),
                    node,
                )
                self._on_lost(uid)
                self._k8s.delete_pod(name, grace_seconds=0)
                self.force_deleted.append(name)
                with self._lock:
                    self._deadlines.pop(uid, None)
            except K8sApiError as e:
                logger.warning("cannot force-delete pod %s: %s (tried again)", name, e)

    def _run(self) -> None:
        while not self._stop.wait(_SWEEP_SECONDS):
            try:
                self.sweep()
            except Exception:  # the sweep must outlive a bad reading
                logger.exception("lost-pod sweep failed")
