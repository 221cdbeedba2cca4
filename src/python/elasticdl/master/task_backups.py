"""Stragglers near the end of the data: their tasks backed up by idle workers, their share of
what is left kept to what they can finish in time.

* **Backups.** When a worker that holds nothing asks for work, none is queued and no epoch is
  left to create (it would wait), it gets a copy of a training task that a slow worker
  (``master.stragglers``) has run for at least ``BACKUP_MIN_AGE_SECONDS``, the oldest such
  task first, one copy per task. The task is
  then held twice; **the first report of it wins**: it is counted (once) and the other
  holder's later report is dropped (``backup_reports_dropped``; not a stale report, as no
  task was taken back). A failure reported by one holder
  is not counted against the task while the other still runs it. A holder that dies, hangs
  past the timeout or was never told of the task (a restarted master) loses its copy; when
  it was the first holder, the copy's worker becomes the task's only holder instead of the
  task going back to the queue. Only training tasks are copied: evaluation outputs and
  predictions would be written twice.
* **Withheld tasks.** Near the end of the data a slow worker gets WAIT instead of a training
  or prediction task when its share of what is queued cannot cover one more task
  (``StragglerTracker.share_allows``), as long as a live worker that is not slow is known
  (it will take the rest; workers that died or hung are forgotten).
* Gradients that the losing holder of a backed-up task pushed before the other reported it
  are applied, as those of a worker that dies mid-task are: a backed-up task's records are
  *counted* once, and may be *trained* partly twice (harmless for SGD, and the price of not
  waiting for the slowest worker).
* **Journaled**: a copy handed out (``TaskBackedUp``) and copies dropped (``BackupsDropped``)
  are ops of their own; a report and a re-queue replay through the same code as live, which
  decides from the state alone. Withholding needs no op: it hands nothing out.
"""
from __future__ import annotations

import logging

from elasticdl.master.journal_ops import BackupsDropped
from elasticdl.master.stragglers import StragglerTracker
from elasticdl.master.tasks import Assignment, Task, TaskType

logger = logging.getLogger(__name__)

# Tasks whose pace counts and that may be withheld from a slow worker.
_PACED = (TaskType.TRAINING, TaskType.PREDICTION)

# A task is copied only once its slow holder has had it this long. A copy costs the idle
# worker a task's start-up (its shard read, a model pull) and pushes its gradients a second
# time; for a task shorter than this the copy cannot win back what it costs, and a worker
# that looks several times slower over such a span is more often paused by a busy machine
# (a scheduler hiccup, a garbage collection) than a straggler.
BACKUP_MIN_AGE_SECONDS = 2.0


class TaskBackups:
    """The straggler side of :class:`~elasticdl.master.task_manager.TaskManager`, which
    inherits it: ``_doing``, ``_todo``, the clock and the journal are the task manager's."""

    def _init_backups(self, factor: float) -> None:
        self._stragglers = StragglerTracker(factor)
        self._backups: dict[int, Assignment] = {}  # task id -> its copy's holder
        self._abandoned: dict[int, int] = {}  # worker -> the backed-up task it lost
        self._backups_issued = 0
        self._backups_won = 0
        self._backup_reports_dropped = 0  # reports of a task whose other holder was first
        self._tasks_withheld = 0

    # ---- pace --------------------------------------------------------------------------
    def _held(self, worker_id: int) -> list[Assignment]:
        held = [d for d in self._doing.values() if d.worker_id == worker_id]
        return held + [b for b in self._backups.values() if b.worker_id == worker_id]

    def _running_records(self) -> dict[int, int]:
        """Worker -> records of the oldest task it holds (the one it runs), or of all the
        tasks of its oldest lease (it runs them one after another, all timed from the lease)."""
        oldest: dict[int, Assignment] = {}
        lease_records: dict[tuple[int, int], int] = {}  # (worker, lease) -> records held
        for d in list(self._doing.values()) + list(self._backups.values()):
            if d.task.type not in _PACED:
                continue
            if d.worker_id not in oldest or d.start_time < oldest[d.worker_id].start_time:
                oldest[d.worker_id] = d
            if d.lease:
                key = (d.worker_id, d.lease)
                lease_records[key] = lease_records.get(key, 0) + d.task.num_records
        return {
            w: lease_records[(w, d.lease)] if d.lease else d.task.num_records
            for w, d in oldest.items()
        }

    def _note_started(self, worker_id: int) -> None:
        if self._replaying:
            return
        if not self._stragglers.enabled:
            # No pace to time: only known as working (lease sizes), without the scan of
            # every held task that finding whether it held one costs.
            self._stragglers.known(worker_id)
        elif not self._held(worker_id):
            self._stragglers.started(worker_id, self._clock())

    def _note_reported(self, worker_id: int, task: Task, success: bool) -> None:
        if not self._replaying:
            measured = success and task.type in _PACED
            if self._note_lease_report(task, measured):
                return  # the lease call reports its results' pace as one
            self._stragglers.reported(worker_id, task.num_records, self._clock(), measured)

    def _slow_workers(self) -> dict[int, float]:
        return self._stragglers.slow(self._clock(), self._running_records())

    # ---- withholding -------------------------------------------------------------------
    def _withhold(self, worker_id: int) -> bool:
        """Whether slow ``worker_id`` gets WAIT instead of the next queued task."""
        if self._replaying or not self._stragglers.enabled or self._epochs_remain():
            return False
        if not self._todo or self._todo[0].type not in _PACED:
            return False
        now, running = self._clock(), self._running_records()
        slow = self._stragglers.slow(now, running)
        if worker_id not in slow:
            return False
        if all(w in slow for w in self._stragglers.paces(now, running)):
            return False  # no live worker that is not slow would take the rest
        queued = sum(t.num_records for t in self._todo if t.type in _PACED)
        held = len(self._held(worker_id))
        if self._stragglers.share_allows(
            worker_id, now, running, held, queued, self._todo[0].num_records
        ):
            return False
        self._tasks_withheld += 1
        logger.info(
            "Worker %d is %.1fx slower than its peers: no more tasks for it (%d records left, "
            "%d task(s) held)",
            worker_id,
            slow[worker_id],
            queued,
            held,
        )
        return True

    # ---- backups -----------------------------------------------------------------------
    def _backup_for(self, worker_id: int) -> Task | None:
        """A copy of a slow worker's training task for idle ``worker_id``, or None."""
        if self._replaying or not self._stragglers.enabled or self._held(worker_id):
            return None
        slow = self._slow_workers()
        if not slow or worker_id in slow:
            return None
        now = self._clock()
        candidates = sorted(
            (
                d
                for d in self._doing.values()
                if d.worker_id in slow
                and d.task.type == TaskType.TRAINING
                and d.task.task_id not in self._backups
                and now - d.start_time >= BACKUP_MIN_AGE_SECONDS
            ),
            key=lambda d: d.start_time,
        )
        if not candidates:
            return None
        slowest = candidates[0]
        logger.info(
            "Worker %d is %.1fx slower than its peers: %s backed up by worker %d",
            slowest.worker_id,
            slow[slowest.worker_id],
            slowest.task.describe(),
            worker_id,
        )
        return self._add_backup(worker_id, slowest.task.task_id)

    def _add_backup(self, worker_id: int, task_id: int) -> Task:
        """Live and in replay (``TaskBackedUp``)."""
        task = self._doing[task_id].task
        self._note_started(worker_id)
        self._backups[task_id] = Assignment(task, worker_id, self._clock())
        self._backups_issued += 1
        return task

    def _is_backup(self, task_id: int, worker_id: int) -> bool:
        backup = self._backups.get(task_id)
        return backup is not None and backup.worker_id == worker_id

    def _claim(self, task_id: int, worker_id: int, success: bool) -> tuple[Assignment | None, bool]:
        """The holder's assignment a report of ``task_id`` by ``worker_id`` settles, removed
        from its table (None: not a holder), and whether the report counts (False: a failure
        while the other holder of a backed-up task still runs it)."""
        doing = self._doing.get(task_id)
        backup = self._backups.get(task_id)
        if backup is not None and backup.worker_id == worker_id:
            del self._backups[task_id]
            if not success:
                return backup, False
            del self._doing[task_id]
            self._abandoned[doing.worker_id] = task_id
            self._backups_won += 1
            return backup, True
        if doing is None or doing.worker_id != worker_id:
            return None, True
        del self._doing[task_id]
        if backup is not None:
            del self._backups[task_id]
            if not success:  # the copy goes on as the task's only holder
                self._doing[task_id] = backup
                self._last_owner[task_id] = backup.worker_id
                return doing, False
            self._abandoned[backup.worker_id] = task_id
        return doing, True

    def _dropped_report(self, task_id: int, worker_id: int) -> bool:
        """A report of the task ``worker_id`` lost to another holder: dropped and counted as
        such (not as a stale report: no task was taken back from it)."""
        if self._abandoned.get(worker_id) != task_id:
            return False
        del self._abandoned[worker_id]
        self._backup_reports_dropped += 1
        logger.info(
            "Report of task %d from worker %d dropped: its other holder reported it first",
            task_id,
            worker_id,
        )
        return True

    def _promote_backup(self, task_id: int) -> bool:
        """The first holder of ``task_id`` is gone: its copy's holder keeps it, if any."""
        backup = self._backups.pop(task_id, None)
        if backup is None:
            return False
        self._doing[task_id] = backup
        self._last_owner[task_id] = backup.worker_id
        return True

    def _drop_backups(self, worker_ids: set[int]) -> list[int]:
        """Drop the copies ``worker_ids`` hold (they died or hang); journaled."""
        ids = sorted(i for i, b in self._backups.items() if b.worker_id in worker_ids)
        if ids:
            self._drop_backup_ids(ids)
            self._record(BackupsDropped(tuple(ids)))
        for worker_id in worker_ids:
            self._abandoned.pop(worker_id, None)
            if not self._replaying:
                self._stragglers.forget(worker_id)
        return ids

    def _drop_backup_ids(self, ids) -> None:
        for task_id in ids:
            self._backups.pop(task_id, None)

    # ---- reporting ---------------------------------------------------------------------
    def abandoned_workers(self) -> set[int]:
        """Workers still running a task whose other holder reported it first: nothing they do
        counts any more, so the end of the job need not wait for them."""
        with self._lock:
            return set(self._abandoned)

    def straggler_status(self) -> dict:
        """For the job status: the slow workers now, and what was done about them."""
        with self._lock:
            now, running = self._clock(), self._running_records()
            slow = self._stragglers.slow(now, running)
            paces = self._stragglers.paces(now, running)
            return {
                "factor": self._stragglers.factor,
                "slow_workers": [
                    {
                        "worker": w,
                        "seconds_per_record": round(paces[w], 6),
                        "times_median": round(ratio, 2),
                    }
                    for w, ratio in sorted(slow.items())
                ],
                "ever_slow": sorted(self._stragglers.ever_slow),
                "backups_issued": self._backups_issued,
                "backups_won": self._backups_won,
                "backup_reports_dropped": self._backup_reports_dropped,
                "tasks_withheld": self._tasks_withheld,
            }
