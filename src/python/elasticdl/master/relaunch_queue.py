"""Relaunches that run beside the platform's event thread, one at a time per replica.

The replica manager handles every replica's events on the platform's single event thread. A
relaunch may have to wait there for a long time: on Kubernetes a PS comes back under its own
pod name (so its address stays), and the new pod can only be created once the old one is gone;
the pod of a lost node stays ``Terminating`` until the node controller removes it, minutes
later. Waiting on the event thread would leave every other replica's end unhandled meanwhile
(a worker lost on the same node not relaunched, its tasks' status lagging).

:class:`RelaunchQueue` runs each relaunch on a thread of its own instead. Relaunches of one
replica run in the order they were submitted, never two at once; those of different replicas
run side by side. Once closed (the job is ending) it starts nothing more: a relaunch not yet
begun is dropped, one under way is left to find its platform shut down.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, Hashable

logger = logging.getLogger(__name__)


class RelaunchQueue:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._waiting: dict[Hashable, collections.deque[Callable[[], None]]] = {}
        self._workers: dict[Hashable, threading.Thread] = {}
        self._closed = False

    def submit(self, key: Hashable, relaunch: Callable[[], None]) -> bool:
        """Run ``relaunch`` after the relaunches of ``key`` submitted before it; False when
        the queue is closed (nothing will run)."""
        with self._lock:
            if self._closed:
                return False
            self._waiting.setdefault(key, collections.deque()).append(relaunch)
            if key in self._workers:  # its thread takes this one when the current one is done
                return True
            worker = threading.Thread(
                target=self._run, args=(key,), name=f"relaunch-{key}", daemon=True
            )
            self._workers[key] = worker
        worker.start()
        return True

    def busy(self, key: Hashable) -> bool:
        """Whether a relaunch of ``key`` is under way or waiting."""
        with self._lock:
            return key in self._workers

    def close(self) -> None:
        """Start no relaunch from now on; those not begun are dropped."""
        with self._lock:
            self._closed = True
            self._waiting.clear()

    def wait_idle(self, timeout: float) -> bool:
        """Until no relaunch is under way; False after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._workers:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _run(self, key: Hashable) -> None:
        while True:
            with self._lock:
                waiting = self._waiting.get(key)
                if not waiting:
                    self._waiting.pop(key, None)
                    del self._workers[key]
                    self._idle.notify_all()
                    return
                relaunch = waiting.popleft()
            try:
                relaunch()
            except Exception:  # one failed relaunch must not stop the replica's later ones
                logger.exception("relaunch of %s failed", key)
