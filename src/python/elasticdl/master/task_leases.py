"""Task leases: several results taken and several tasks handed to one worker in one call.

The master's cost per call (the RPC stack's, most of it) is then paid once per lease instead
of once per task. What a lease keeps of the task manager's guarantees:

* **Every leased task is an ordinary hand-out.** Each task of a lease goes through the same
  path a single ``get`` takes (it is in ``_doing``, owned by the worker, counted once when
  reported); a worker that dies or hangs gets every task it holds re-queued, the ones of its
  lease it had not started included.
* **Size.** At most what the worker asks for (``max_tasks``, capped by ``MAX_LEASE_TASKS``),
  and at most its share of what is queued, ``ceil(queued / workers)`` (workers: those the
  master knows are working), so near the end of an epoch leases shrink to one task and no
  worker sits on tasks while others have none. A lease never spans two epochs or two task
  types. Evaluation tasks, the model-export task and backup copies are handed one at a time,
  as a single ``get`` does (an evaluation round should spread over the workers), and with
  stragglers on (``straggler_factor``) a slow worker gets a lease of one task, so the
  withholding of ``master.task_backups`` still decides each of its tasks.
* **Idempotent.** A call that repeats the worker's last call (its answer was lost, e.g. to a
  master that died) gets again the tasks of that lease the worker still holds, and its
  results are not applied twice. The worker numbers its calls (``call_id``, the same on a
  retry): that tells a repeat from a new call that happens to carry the same results (a task
  that failed, came back to the same worker in the lease and failed again). Without a
  number a call is taken for a repeat when it carries results, none of them is accepted any
  more and they are those of the last call (the rule of ``report_and_get``).
* **Journaled.** Each result is a ``TaskReported`` op, the lease one ``TasksLeased`` op with
  its task ids, the call's number and the results it answered, so a restarted master replays
  it to the same owners and answers a repeat the same way. A repeat changes nothing and is
  not journaled.
* **Pace.** The results of one call are one report to the straggler tracker (the records of
  all of them over the time since the worker's last report), and the tasks of one lease share
  their start time and count together as what the worker runs, so the time a leased task
  waits behind the others of its lease does not make its worker look slow. The timeout of a
  task still runs from its hand-out, which is consistent: the longest task seen (that the
  timeout scales with) is measured the same way, from hand-out to report.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from elasticdl.master.journal import JournalError
from elasticdl.master.journal_ops import TasksLeased
from elasticdl.master.tasks import Task, TaskType

# The most tasks one call hands out, whatever the worker asks.
MAX_LEASE_TASKS = 64

# Task types that may be leased several at a time.
_LEASABLE = (TaskType.TRAINING, TaskType.PREDICTION)


def answering_key(results: Sequence[Mapping[str, Any]]) -> tuple[int, ...]:
    """The results of a call as the flat (task, success 1/0, ...) tuple journaled with it."""
    key: list[int] = []
    for r in results:
        key += [int(r["task_id"]), int(bool(r["success"]))]
    return tuple(key)


class TaskLeases:
    """The lease side of :class:`~elasticdl.master.task_manager.TaskManager`, which inherits
    it: ``_doing``, ``_todo``, the report and hand-out paths and the journal are its."""

    def _init_leases(self) -> None:
        # worker -> (number of its last lease call, its results, the tasks it got)
        self._last_lease: dict[int, tuple[int, tuple[int, ...], tuple[int, ...]]] = {}
        # While one call's results are applied: [accepted reports, their paced records].
        self._batch_pace: list[int] | None = None

    def lease(
        self,
        worker_id: int,
        results: Sequence[Mapping[str, Any]],
        max_tasks: int,
        call_id: int = 0,
    ) -> list[Task]:
        """Apply ``results`` (each with ``report``'s keyword arguments but ``worker_id``), then
        hand ``worker_id`` up to ``max_tasks`` tasks (see the module docstring); ``call_id``:
        the worker's number of this call (0: none). Returns the tasks, or ``[WAIT_TASK]`` /
        ``[NO_MORE_TASKS]`` when there is none; ``[]`` when ``max_tasks`` is 0."""
        answering = answering_key(results)
        listeners_args = []
        with self._lock:
            self._note_contact(worker_id)
            last = self._last_lease.get(worker_id)
            if call_id and last is not None and last[0] == call_id:
                # A repeat: its results were applied the first time.
                tasks = self._held_of_lease(worker_id, last[2])
                if not tasks and max_tasks > 0:  # all taken back since: a new lease
                    tasks = self._hand_out_lease_locked(worker_id, max_tasks, last[1], call_id)
                    self._maybe_snapshot()
                return tasks
            accepted_any = False
            self._batch_pace = [0, 0]
            try:
                for r in results:
                    accepted, args, op = self._report_op_locked(
                        r["task_id"],
                        r["success"],
                        worker_id,
                        r.get("exec_counters"),
                        r.get("err_message", ""),
                        r.get("model_version"),
                    )
                    self._record(op)
                    accepted_any = accepted_any or accepted
                    if args is not None:
                        listeners_args.append(args)
            finally:
                reported, records = self._batch_pace
                self._batch_pace = None
            if reported and not self._replaying:
                self._stragglers.reported(worker_id, records, self._clock(), records > 0)
            self._fire_if_training_finished_locked()
            tasks: list[Task] = []
            if max_tasks > 0:
                if not call_id and answering and not accepted_any:
                    if last is not None and not last[0] and last[1] == answering:
                        tasks = self._held_of_lease(worker_id, last[2])
                if not tasks:
                    tasks = self._hand_out_lease_locked(worker_id, max_tasks, answering, call_id)
            self._maybe_snapshot()
        for args in listeners_args:
            for listener in self._done_listeners:
                listener(*args)
        return tasks

    def _note_lease_report(self, task: Task, measured: bool) -> bool:
        """Within a lease call: count the report into the call's one pace sample (True)."""
        if self._batch_pace is None:
            return False
        self._batch_pace[0] += 1
        if measured:
            self._batch_pace[1] += task.num_records
        return True

    def _held_of_lease(self, worker_id: int, task_ids: tuple[int, ...]) -> list[Task]:
        """The tasks of ``task_ids`` that ``worker_id`` still holds."""
        tasks = []
        for task_id in task_ids:
            doing = self._doing.get(task_id)
            if self._is_backup(task_id, worker_id):
                tasks.append(self._backups[task_id].task)
            elif doing is not None and doing.worker_id == worker_id:
                tasks.append(doing.task)
        return tasks

    def _lease_size(self, worker_id: int, first: Task, max_tasks: int) -> int:
        if first.type not in _LEASABLE or self._is_backup(first.task_id, worker_id):
            return 1
        if self._stragglers.enabled and worker_id in self._slow_workers():
            return 1
        workers = max(1, self._stragglers.known_workers)
        share = math.ceil((len(self._todo) + 1) / workers)
        return max(1, min(max_tasks, MAX_LEASE_TASKS, share))

    def _hand_out_lease_locked(
        self, worker_id: int, max_tasks: int, answering: tuple[int, ...], call_id: int
    ) -> list[Task]:
        first = self._get_locked(worker_id)
        if not first.task_id:
            return [first]
        tasks = [first]
        backup = self._is_backup(first.task_id, worker_id)
        size = self._lease_size(worker_id, first, max_tasks)
        while (
            len(tasks) < size
            and not self._eval_todo
            and self._todo
            and self._todo[0].type == first.type
            and self._todo[0].epoch == first.epoch
        ):
            task = self._get_locked(worker_id)
            if not task.task_id:  # withheld from a slow worker
                break
            tasks.append(task)
        self._share_start_time(worker_id, tasks)
        ids = tuple(t.task_id for t in tasks)
        self._record(TasksLeased(worker_id, ids, answering, backup, call_id))
        if answering or call_id:
            self._last_lease[worker_id] = (call_id, answering, ids)
        return tasks

    def _share_start_time(self, worker_id: int, tasks: list[Task]) -> None:
        if len(tasks) < 2:
            return
        start = self._doing[tasks[0].task_id].start_time
        for t in tasks:
            d = self._doing[t.task_id]
            d.start_time, d.lease = start, tasks[0].task_id

    def _apply_lease_locked(self, op: TasksLeased) -> None:
        """Replay of a ``TasksLeased`` op: the same hand-outs to the same worker."""
        if op.backup:
            self._add_backup(op.worker, op.tasks[0])
        else:
            for task_id in op.tasks:
                task = self._get_locked(op.worker)
                if task.task_id != task_id:
                    raise JournalError(
                        f"journal op {op}: this job hands out task {task.task_id} there; the "
                        "journal was written for other data or another ElasticDL version"
                    )
        if op.answering or op.call:
            self._last_lease[op.worker] = (op.call, tuple(op.answering), tuple(op.tasks))

    # ---- state (journal snapshots) ---------------------------------------------------------
    def _lease_state(self) -> dict:
        """Only where leases were used: a job without them keeps the earlier state."""
        if not self._last_lease:
            return {}
        return {
            "last_lease": sorted(
                [w, c, list(a), list(t)] for w, (c, a, t) in self._last_lease.items()
            )
        }

    def _restore_leases(self, state: dict) -> None:
        self._last_lease = {
            w: (c, tuple(a), tuple(t)) for w, c, a, t in state.get("last_lease", [])
        }
