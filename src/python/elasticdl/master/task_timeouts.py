"""Tasks taken back from workers that died or hang.

A task a dead worker held goes back to the front of its queue at once (``recover_tasks``); that
is not a failure of the task and consumes no retry.

* **Hung workers.** A task running longer than ``max(timeout_floor_s, timeout_factor x the
  longest task seen so far)`` (the floor is ``--task_timeout``) is taken back
  (``check_timeouts``) and its worker is reported to the caller, which deletes/relaunches it
  with ``--relaunch_timeout_worker``; otherwise the worker's late report of it is ignored
  unless the task is still queued (then it counts, once). A stopped PS stalls every worker
  this way; the job goes on when it resumes.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Callable

from elasticdl.master.tasks import TaskType

logger = logging.getLogger(__name__)


class TaskTimeouts:
    """The recovery side of :class:`~elasticdl.master.task_manager.TaskManager`, which inherits
    it: the attributes it reads are the task manager's state, ``_requeue_locked`` its re-queue
    path."""

    def recover_tasks(self, worker_id: int) -> list[int]:
        """Put every task ``worker_id`` holds back at the front of its queue (the worker died
        or was deleted); returns their ids. Not counted as a task failure."""
        return self._recover({worker_id})

    def _recover(self, worker_ids: set[int]) -> list[int]:
        with self._lock:
            mine = [d.task for d in self._doing.values() if d.worker_id in worker_ids]
            self._requeue_locked([t.task_id for t in mine])
            if mine:
                logger.info(
                    "Recovered %d task(s) of worker(s) %s: %s",
                    len(mine),
                    sorted(worker_ids),
                    ", ".join(t.describe() for t in mine),
                )
            return [t.task_id for t in mine]

    def check_timeouts(self) -> dict[int, list[int]]:
        """Take back tasks running longer than the timeout; returns {worker_id: [task ids]}
        so the caller can delete/relaunch those workers."""
        with self._lock:
            limit = max(
                self.config.timeout_floor_s, self.config.timeout_factor * self._max_task_seconds
            )
            now = self._clock()
            slow: dict[int, list[int]] = collections.defaultdict(list)
            for d in self._doing.values():
                if d.task.type != TaskType.TRAIN_END_CALLBACK and now - d.start_time > limit:
                    slow[d.worker_id].append(d.task.task_id)
            for worker_id, ids in slow.items():
                logger.warning(
                    "Worker %d exceeded the task timeout (%.0f s) on task(s) %s",
                    worker_id,
                    limit,
                    ids,
                )
            if slow:
                self._recover(set(slow))
            return dict(slow)

    def start_timeout_monitor(
        self, on_timeout: Callable[[int], None], interval_s: float = 30.0
    ) -> None:
        """Background thread: every ``interval_s`` check timeouts and call ``on_timeout(worker_id)``
        for each hung worker."""

        def loop():
            while not self._stop.wait(interval_s):
                for worker_id in self.check_timeouts():
                    try:
                        on_timeout(worker_id)
                    except Exception:
                        logger.exception("Timeout handler failed for worker %d", worker_id)

        self._timeout_thread = threading.Thread(target=loop, name="task-timeouts", daemon=True)
        self._timeout_thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._timeout_thread is not None:
            self._timeout_thread.join(timeout=5)
