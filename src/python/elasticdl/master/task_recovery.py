"""What lets a restarted master rebuild its task manager: the task manager's state as data
(a journal snapshot), replay of the ops it journaled, and the tasks it inherits from the
master that died.

* **Journaled.** With a journal attached (``attach_journal``, see ``master.journal``) every
  transition is recorded as one small op (task handed out, reported, re-queued, evaluation
  tasks created, training done, job failed) before the call that caused it returns, so before
  the RPC is answered; ``replay`` of those ops on a task manager built from the same shards
  gives the same state (ops are deterministic: shuffling is seeded, clock readings travel in
  the op). A restarted master replays, then ``resume_after_restart``: tasks handed out before
  the crash stay with their worker, whose report is accepted once when it reconnects; a task
  whose worker has talked to the new master for ``inherited_grace_s`` without reporting it
  (its answer was lost with the old master) goes back to the queue (``requeue_unclaimed``).
  A worker that repeats a report-and-get call whose answer it lost gets the same task again.
"""

from __future__ import annotations

import collections
import logging
from typing import Iterable

from elasticdl.common.types import Shard
from elasticdl.master.journal import JournalError
from elasticdl.master.journal_ops import (
    TASK_OPS,
    BackupsDropped,
    EvaluationRoundDropped,
    EvaluationTasksCreated,
    JournaledOwner,
    JournalOp,
    TaskBackedUp,
    TaskHandedOut,
    TaskReported,
    TasksFailed,
    TasksLeased,
    TasksRequeued,
    TrainingDone,
    decode,
)
from elasticdl.master.tasks import Assignment, Task, TaskType

logger = logging.getLogger(__name__)


class TaskRecovery(JournaledOwner):
    """The journal side of :class:`~elasticdl.master.task_manager.TaskManager`, which inherits
    it: the attributes below are the task manager's state, the methods it calls back are its
    hand-out, report and re-queue paths (replay runs the same code the live calls ran)."""

    OPS = TASK_OPS

    # ---- journal ---------------------------------------------------------------------------
    def _maybe_snapshot(self) -> None:
        """At the end of an outer call (get, report): the state is then exactly that after
        every recorded op (nested ones, from listeners, included)."""
        if self._sink is not None and not self._replaying and self._sink.wants_snapshot():
            self._sink.snapshot(self._state_locked())

    def state(self) -> dict:
        """Everything a restarted master needs, as JSON-able data (a journal snapshot)."""
        with self._lock:
            return self._state_locked()

    def _state_locked(self) -> dict:
        return {
            "next_id": self._next_id,
            "todo": [t.to_state() for t in self._todo],
            "eval_todo": [t.to_state() for t in self._eval_todo],
            "doing": [[d.task.to_state(), d.worker_id] for d in self._doing.values()],
            "last_owner": sorted(self._last_owner.items()),
            "completed": sorted(
                [int(k[0]), k[1], k[2], k[3].name, k[3].start, k[3].end]
                for k in self._completed_keys
            ),
            "epoch": self._epoch,
            "max_step_reached": self._max_step_reached,
            "train_end_state": self._train_end_state,
            "training_done_fired": self._training_done_fired,
            "failed_message": self._failed_message,
            "tasks_done": self._tasks_done,
            "tasks_retried": self._tasks_retried,
            "tasks_recovered": self._tasks_recovered,
            "tasks_failed": self._tasks_failed,
            "stale_reports": self._stale_reports,
            "records_trained": sorted(self._records_trained.items()),
            "records_dropped": self._records_dropped,
            "records_predicted": self._records_predicted,
            "completed_steps": self._completed_steps,
            "exec_counters": dict(sorted(self._exec_counters.items())),
            "max_task_seconds": self._max_task_seconds,
            "model_version_seen": self._model_version_seen,
            "last_exchange": sorted(
                [w, a, int(s), b] for w, (a, s, b) in self._last_exchange.items()
            ),
            **self._backup_state(),
            **self._lease_state(),
        }

    def _backup_state(self) -> dict:
        """Only where backups were used: a job without them keeps the earlier state."""
        if not (self._backups or self._backups_issued):
            return {}
        return {
            "backups": sorted([i, b.worker_id] for i, b in self._backups.items()),
            "backups_issued": self._backups_issued,
            "backups_won": self._backups_won,
            "backup_reports_dropped": self._backup_reports_dropped,
            "abandoned": sorted(self._abandoned.items()),
        }

    def restore(self, state: dict) -> None:
        """Become the task manager that ``state`` (from :meth:`state`) describes."""
        with self._lock:
            now = self._clock()
            self._next_id = state["next_id"]
            self._todo = collections.deque(Task.from_state(v) for v in state["todo"])
            self._eval_todo = collections.deque(Task.from_state(v) for v in state["eval_todo"])
            self._doing = {}
            for v, worker_id in state["doing"]:
                task = Task.from_state(v)
                self._doing[task.task_id] = Assignment(task, worker_id, now)
            self._last_owner = {int(k): v for k, v in state["last_owner"]}
            self._completed_keys = {
                (TaskType(k[0]), k[1], k[2], Shard(k[3], k[4], k[5])) for k in state["completed"]
            }
            self._epoch = state["epoch"]
            self._max_step_reached = state["max_step_reached"]
            self._train_end_state = state["train_end_state"]
            self._training_done_fired = state["training_done_fired"]
            self._failed_message = state["failed_message"]
            for name in (
                "tasks_done",
                "tasks_retried",
                "tasks_recovered",
                "tasks_failed",
                "stale_reports",
                "records_dropped",
                "records_predicted",
                "completed_steps",
                "max_task_seconds",
                "model_version_seen",
            ):
                setattr(self, f"_{name}", state[name])
            self._records_trained = collections.defaultdict(
                int, {int(k): v for k, v in state["records_trained"]}
            )
            self._exec_counters = collections.defaultdict(int, state["exec_counters"])
            self._last_exchange = {w: (a, bool(s), b) for w, a, s, b in state["last_exchange"]}
            self._backups = {
                task_id: Assignment(self._doing[task_id].task, worker_id, now)
                for task_id, worker_id in state.get("backups", [])
            }
            self._backups_issued = state.get("backups_issued", 0)
            self._backups_won = state.get("backups_won", 0)
            self._backup_reports_dropped = state.get("backup_reports_dropped", 0)
            self._abandoned = {w: t for w, t in state.get("abandoned", [])}
            self._restore_leases(state)

    def replay(self, snapshot: dict | None, records: Iterable[dict]) -> int:
        """Rebuild the state from a journal: ``restore(snapshot)``, then apply its ops in order.
        Returns how many ops were applied. Raises JournalError when an op does not match what
        this task manager does (the journal belongs to other data or another version)."""
        if snapshot is not None:
            self.restore(snapshot)
        n = 0
        with self._lock:
            self._replaying = True
            try:
                for record in records:
                    self._apply_locked(decode(record, TASK_OPS))
                    n += 1
            except (KeyError, TypeError, ValueError) as e:
                raise JournalError(f"journal op {n + 1} cannot be replayed: {e!r}") from e
            finally:
                self._replaying = False
        return n

    def _apply_locked(self, op: JournalOp) -> None:
        match op:
            case TaskHandedOut(worker, task_id, answering):
                task = self._get_locked(worker)
                if task.task_id != task_id:
                    raise JournalError(
                        f"journal op {op}: this job hands out task {task.task_id} there; the "
                        "journal was written for other data or another ElasticDL version"
                    )
                if answering is not None:
                    self._last_exchange[worker] = (answering[0], answering[1], task_id)
            case TaskReported():
                self._report_locked(
                    op.task,
                    op.success,
                    op.worker,
                    op.counters,
                    op.error,
                    op.model_version,
                    op.duration,
                )
                if op.handed_out is not None:  # report_and_get: handed out in the same call
                    answering = (op.task, op.success)
                    self._apply_locked(TaskHandedOut(op.worker, op.handed_out, answering))
            case TaskBackedUp(worker, task_id, answering):
                self._add_backup(worker, task_id)
                if answering is not None:
                    self._last_exchange[worker] = (answering[0], answering[1], task_id)
            case TasksLeased():
                self._apply_lease_locked(op)
            case BackupsDropped(tasks):
                self._drop_backup_ids(tasks)
            case TasksRequeued(tasks):
                self._requeue_locked(list(tasks))
            case EvaluationTasksCreated(version):
                self.create_evaluation_tasks(version)
            case EvaluationRoundDropped(version):
                self._drop_evaluation_round_locked(version)
            case TrainingDone():
                self._training_done_fired = True
            case TasksFailed(message):
                self._failed_message = self._failed_message or message
            case _:
                raise JournalError(f"unknown journal op {op!r}")

    # ---- after a restart -------------------------------------------------------------------
    def resume_after_restart(self) -> list[int]:
        """Called once after replay by a restarted master: every task handed out before the
        crash stays its worker's (counted when it reports), timed from now. Returns their ids."""
        with self._lock:
            now = self._clock()
            for d in list(self._doing.values()) + list(self._backups.values()):
                d.inherited, d.start_time = True, now
            self._contact = {}
            return sorted(self._doing)

    def _note_contact(self, worker_id: int) -> None:
        if self._contact is not None and worker_id not in self._contact:
            self._contact[worker_id] = self._clock()

    def requeue_unclaimed(self) -> list[int]:
        """Inherited tasks whose worker has called the new master for ``inherited_grace_s``
        (or ``timeout_factor`` x the longest task, if longer) without reporting them: the
        answer that handed them out died with the old master. Back to the queue."""
        with self._lock:
            self._drop_unclaimed_backups()
            inherited = [d for d in self._doing.values() if d.inherited]
            if not inherited:
                self._contact = None  # nothing inherited left: stop noting contacts
                return []
            grace = max(self.inherited_grace_s, self.config.timeout_factor * self._max_task_seconds)
            now = self._clock()
            ids = [
                d.task.task_id
                for d in inherited
                if d.worker_id in self._contact and now - self._contact[d.worker_id] > grace
            ]
            if ids:
                logger.warning(
                    "Task(s) %s were handed out by the previous master but their workers never "
                    "got them; re-queued",
                    ids,
                )
                self._requeue_locked(ids)
            return ids

    def _drop_unclaimed_backups(self) -> None:
        """Inherited copies whose worker has called the new master for the grace period
        without reporting them (the answer that handed them out died with the old master)."""
        grace = max(self.inherited_grace_s, self.config.timeout_factor * self._max_task_seconds)
        now = self._clock()
        ids = sorted(
            task_id
            for task_id, b in self._backups.items()
            if b.inherited
            and self._contact is not None
            and b.worker_id in self._contact
            and now - self._contact[b.worker_id] > grace
        )
        if ids:
            self._drop_backup_ids(ids)
            self._record(BackupsDropped(tuple(ids)))
