"""Dynamic data sharding: the master's queue of tasks handed to workers.

The data reader cuts the input into shards (``name, [start, end)``); the task manager splits them
into tasks of ``records_per_task = minibatch_size * num_minibatches_per_task`` records and hands
them out one at a time to whichever worker asks. A worker that dies, hangs or fails a task does
not lose data: its tasks go back into the queue and another worker trains them.

Guarantees kept here, on top of the original design:

* **Exactly-once accounting.** Every (epoch, shard, start, end) range is counted as trained at
  most once. A report is only accepted from the worker that currently owns the task; a late
  report from a worker whose task was taken away (it died or timed out) and given to another
  worker is ignored. So after any number of worker failures ``records_trained ==
  records_expected`` when the job ends. (Records a dying worker had already pushed gradients
  for may be trained twice; that is harmless for SGD and the price of not losing data.)
  A task of a slow worker may be *backed up*, held by two workers at once: the first
  report of it is the one accepted and counted, the other holder's is dropped, so the
  count stays exactly once (the gradients the loser pushed before that count as a dying
  worker's do). See ``master.task_backups``.
* **Bounded retries.** A task that *fails* (the worker reports an error) is retried up to
  ``max_task_retries`` times; then it is dropped and the job fails with a message naming the
  shard and the last error. A task taken back from a dead worker is not a failure of the task
  and does not consume a retry.
* **Hung workers**: see ``master.task_timeouts``, which implements it.
* **Stragglers** (``straggler_factor`` > 0): near the end of the data a worker several times
  slower than its peers gets no more work than its share, and its tasks are backed up by idle
  workers: see ``master.task_backups``, which implements it, and ``master.stragglers``.
* **Journaled**: see ``master.task_recovery``, which implements it.
* **Leases**: several results and several tasks in one call (``lease``), each task handed out
  and accounted as above: see ``master.task_leases``, which implements it.

Order of work: pending evaluation tasks first (they are pinned to a model version and should
finish quickly), then training/prediction tasks; a new epoch is created when the queue runs
dry; when all training is done a single TRAIN_END_CALLBACK task is issued (if
``saved_model_path`` is set) so one worker exports the model.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import random
import threading
import time
from typing import Any, Callable, Iterable

from elasticdl.common.types import Shard
from elasticdl.master.journal_ops import (
    EvaluationRoundDropped,
    EvaluationTasksCreated,
    TaskBackedUp,
    TaskHandedOut,
    TaskReported,
    TasksFailed,
    TasksRequeued,
    TrainingDone,
)
from elasticdl.master.task_backups import TaskBackups
from elasticdl.master.task_leases import TaskLeases
from elasticdl.master.task_recovery import TaskRecovery
from elasticdl.master.task_timeouts import TaskTimeouts
from elasticdl.master.tasks import (  # noqa: F401 (as_shard: part of this module's names)
    NO_MORE_TASKS,
    WAIT_TASK,
    Assignment,
    DoneListener,
    Task,
    TaskManagerConfig,
    TaskSummary,
    TaskType,
    as_shard,
    split_shards,
)

logger = logging.getLogger(__name__)


class TaskManager(TaskTimeouts, TaskBackups, TaskLeases, TaskRecovery):
    def __init__(
        self,
        config: TaskManagerConfig,
        training_shards: Iterable[Any] = (),
        evaluation_shards: Iterable[Any] = (),
        prediction_shards: Iterable[Any] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._clock = clock
        self._lock = threading.RLock()
        self._training_ranges = split_shards(training_shards, config.records_per_task)
        self._evaluation_ranges = split_shards(evaluation_shards, config.records_per_task)
        self._prediction_ranges = split_shards(prediction_shards, config.records_per_task)
        if self._prediction_ranges and self._training_ranges:
            raise ValueError(
                "a job cannot both train and predict: pass either --training_data or --prediction_data"
            )
        self._records_per_epoch = sum(r.num_records for r in self._training_ranges)

        self._next_id = 1
        self._todo: collections.deque[Task] = collections.deque()
        self._eval_todo: collections.deque[Task] = collections.deque()
        self._doing: dict[int, Assignment] = {}
        self._last_owner: dict[int, int] = {}  # task_id -> last worker it was given to
        self._completed_keys: set[tuple] = set()

        self._epoch = 0  # training epochs created so far
        self._max_step_reached = False
        self._train_end_state = (
            "none" if config.saved_model_path else "not_needed"
        )  # none|issued|done
        self._training_done_fired = False
        self._failed_message = ""

        self._tasks_done = 0
        self._tasks_retried = 0
        self._tasks_recovered = 0
        self._tasks_failed = 0
        self._stale_reports = 0
        self._records_trained: dict[int, int] = collections.defaultdict(int)
        self._records_dropped = 0  # training records not needed any more (max_step)
        self._records_predicted = 0
        self._completed_steps = 0
        self._exec_counters: dict[str, int] = collections.defaultdict(int)
        self._max_task_seconds = 0.0
        self._model_version_seen = 0  # newest PS version a worker reported training against
        # worker -> (task it reported, success, task it got) of its last report-and-get call:
        # a repeat of that call (the answer was lost) gets the same task again.
        self._last_exchange: dict[int, tuple[int, bool, int]] = {}

        self.inherited_grace_s = 10.0
        self._contact: dict[int, float] | None = None  # worker -> first call after a restart
        self._init_backups(config.straggler_factor)
        self._init_leases()
        self._retired: set[int] = set()  # released workers (retire)
        # While set, no task is handed out (the PS set is being changed, see hold()).
        self._dispatch_held = False

        self._done_listeners: list[DoneListener] = []
        self._training_done_listeners: list[Callable[[], None]] = []
        self._timeout_thread: threading.Thread | None = None
        self._stop = threading.Event()

        for r in self._prediction_ranges:
            self._todo.append(self._new_task(TaskType.PREDICTION, r))

    # ---- listeners -----------------------------------------------------------------------
    def add_done_listener(self, listener: DoneListener) -> None:
        self._done_listeners.append(listener)

    def add_training_done_listener(self, listener: Callable[[], None]) -> None:
        """Called once when the last training task is done (before TRAIN_END_CALLBACK); the
        evaluation service uses it to run the final evaluation."""
        self._training_done_listeners.append(listener)

    # ---- properties ----------------------------------------------------------------------
    @property
    def has_training(self) -> bool:
        return bool(self._training_ranges)

    @property
    def has_evaluation_data(self) -> bool:
        return bool(self._evaluation_ranges)

    @property
    def num_training_tasks_per_epoch(self) -> int:
        return len(self._training_ranges)

    @property
    def num_prediction_tasks(self) -> int:
        return len(self._prediction_ranges)

    @property
    def num_evaluation_tasks(self) -> int:
        """Tasks one evaluation round consists of."""
        return len(self._evaluation_ranges)

    @property
    def failed_message(self) -> str:
        return self._failed_message

    @property
    def finished(self) -> bool:
        """No task left to run and none can appear any more."""
        with self._lock:
            return self._finished_locked()

    @property
    def training_finished(self) -> bool:
        with self._lock:
            return self._training_finished_locked()

    # ---- task creation -------------------------------------------------------------------
    def _new_task(self, type_: TaskType, shard: Shard, **kw) -> Task:
        task = Task(task_id=self._next_id, type=type_, shard=shard, **kw)
        self._next_id += 1
        return task

    def _epochs_remain(self) -> bool:
        if not self._training_ranges or self._max_step_reached or self._failed_message:
            return False
        return self.config.num_epochs <= 0 or self._epoch < self.config.num_epochs

    def _create_next_epoch(self) -> None:
        self._epoch += 1
        ranges = list(self._training_ranges)
        if self.config.shuffle:
            random.Random(self.config.seed + self._epoch).shuffle(ranges)
        for r in ranges:
            self._todo.append(self._new_task(TaskType.TRAINING, r, epoch=self._epoch))
        logger.info("Epoch %d: %d training tasks created", self._epoch, len(ranges))

    def create_evaluation_tasks(self, model_version: int) -> list[int]:
        """Queue one evaluation task per validation range, pinned to ``model_version`` (-1 =
        whatever the PS has when the worker runs it); returns their task ids."""
        with self._lock:
            tasks = [
                self._new_task(TaskType.EVALUATION, r, model_version=model_version)
                for r in self._evaluation_ranges
            ]
            self._eval_todo.extend(tasks)
            self._record(EvaluationTasksCreated(model_version))
            return [t.task_id for t in tasks]

    def drop_evaluation_round(self, model_version: int) -> None:
        """Forget the evaluation tasks of ``model_version`` (done or not): a restarted master
        lost that round's buffered outputs and evaluates the version again."""
        with self._lock:
            self._drop_evaluation_round_locked(model_version)
            self._record(EvaluationRoundDropped(model_version))

    def _drop_evaluation_round_locked(self, version: int) -> None:
        def of_round(t: Task) -> bool:
            return t.type == TaskType.EVALUATION and t.model_version == version

        self._eval_todo = collections.deque(t for t in self._eval_todo if not of_round(t))
        for task_id in [i for i, d in self._doing.items() if of_round(d.task)]:
            del self._doing[task_id]
        done = {k for k in self._completed_keys if k[0] == TaskType.EVALUATION and k[2] == version}
        self._completed_keys -= done
        self._tasks_done -= len(done)

    # ---- hand out ------------------------------------------------------------------------
    def get(self, worker_id: int) -> Task:
        """Next task for ``worker_id``; WAIT_TASK if none now but more may come (others are
        still working); NO_MORE_TASKS when the job's work is over (or it failed)."""
        with self._lock:
            self._note_contact(worker_id)
            task = self._get_locked(worker_id)
            if task.task_id:
                self._record(self._hand_out_op(worker_id, task.task_id, None))
            self._maybe_snapshot()
            return task

    def _hand_out_op(
        self, worker_id: int, task_id: int, answering: tuple[int, bool] | None
    ) -> TaskHandedOut | TaskBackedUp:
        if self._is_backup(task_id, worker_id):
            return TaskBackedUp(worker_id, task_id, answering)
        return TaskHandedOut(worker_id, task_id, answering)

    def report_and_get(
        self,
        task_id: int,
        success: bool,
        worker_id: int,
        exec_counters: dict[str, int] | None = None,
        err_message: str = "",
        model_version: int | None = None,
    ) -> Task:
        """``report(...)`` then ``get(worker_id)``, as one idempotent exchange: when the report
        repeats the last one this worker made in such a call (it lost the answer, e.g. to a
        master that died) and the task it got then is still its own, that task again.

        One journal record for both (the report with the task handed out), written under the
        lock like every op, so ops are recorded in the order they happened."""
        with self._lock:
            accepted, listeners_args, op = self._report_op_locked(
                task_id, success, worker_id, exec_counters, err_message, model_version
            )
            if not self._training_done_fired and self._training_finished_locked():
                # Its listeners record ops: this report's op goes first, the get's after.
                self._record(op)
                self._fire_training_done_locked()
                op = None
            task = None
            last = self._last_exchange.get(worker_id)
            if not accepted and last is not None and last[:2] == (task_id, success):
                doing = self._doing.get(last[2])
                if doing is not None and doing.worker_id == worker_id:
                    task = doing.task
                elif self._is_backup(last[2], worker_id):
                    task = self._backups[last[2]].task
            if task is None:
                task = self._get_locked(worker_id)
                if task.task_id:
                    self._last_exchange[worker_id] = (task_id, success, task.task_id)
                    handed = self._hand_out_op(worker_id, task.task_id, (task_id, success))
                    if op is None:
                        op = handed
                    elif isinstance(handed, TaskBackedUp):  # an op of its own, after the report
                        self._record(op)
                        op = handed
                    else:
                        op = dataclasses.replace(op, handed_out=task.task_id)
            if op is not None:
                self._record(op)
            self._maybe_snapshot()
        if listeners_args is not None:
            for listener in self._done_listeners:
                listener(*listeners_args)
        return task

    def _get_locked(self, worker_id: int) -> Task:
        if self._failed_message or worker_id in self._retired:
            return NO_MORE_TASKS
        if self._dispatch_held:
            return WAIT_TASK
        task = None
        if self._eval_todo:
            task = self._eval_todo.popleft()
        elif self._todo:
            if self._withhold(worker_id):
                return WAIT_TASK
            task = self._todo.popleft()
        elif self._epochs_remain():
            self._create_next_epoch()
            task = self._todo.popleft()
        elif self._training_finished_locked():
            self._fire_training_done_locked()
            if self._eval_todo:  # the final evaluation just queued
                task = self._eval_todo.popleft()
            elif self._train_end_state == "none" and self._training_ranges:
                self._train_end_state = "issued"
                task = self._new_task(
                    TaskType.TRAIN_END_CALLBACK,
                    Shard("", 0, 0),
                    extended_config={"saved_model_path": self.config.saved_model_path},
                )
        if task is None:
            if not self._doing:
                return NO_MORE_TASKS
            return self._backup_for(worker_id) or WAIT_TASK
        self._note_started(worker_id)
        self._doing[task.task_id] = Assignment(task, worker_id, self._clock())
        self._last_owner[task.task_id] = worker_id
        return task

    def _training_finished_locked(self) -> bool:
        if self._epochs_remain() or any(t.type == TaskType.TRAINING for t in self._todo):
            return False
        return not any(d.task.type == TaskType.TRAINING for d in self._doing.values())

    def _finished_locked(self) -> bool:
        if self._failed_message:
            return True
        if self._todo or self._eval_todo or self._doing or self._epochs_remain():
            return False
        return self._train_end_state != "none" or not self._training_ranges

    def _fire_training_done_locked(self) -> None:
        if self._training_done_fired or not self._training_ranges or self._replaying:
            return  # replay: TrainingDone sets the flag; listeners ran in the first life
        self._training_done_fired = True
        self._record(TrainingDone())
        logger.info(
            "Training done: %d records in %d epoch(s)",
            sum(self._records_trained.values()),
            self._epoch,
        )
        for listener in self._training_done_listeners:
            listener()

    # ---- results -------------------------------------------------------------------------
    def report(
        self,
        task_id: int,
        success: bool,
        worker_id: int,
        exec_counters: dict[str, int] | None = None,
        err_message: str = "",
        model_version: int | None = None,
    ) -> bool:
        """Record the outcome of ``task_id`` as reported by ``worker_id`` (``model_version``:
        the PS version it trained against, if it says).

        Returns True when the report was accepted, False when it was ignored as stale (the
        task is no longer owned by that worker, or it is unknown).
        """
        with self._lock:
            accepted, listeners_args, op = self._report_op_locked(
                task_id, success, worker_id, exec_counters, err_message, model_version
            )
            self._record(op)
            self._fire_if_training_finished_locked()
            self._maybe_snapshot()
        if listeners_args is not None:
            for listener in self._done_listeners:
                listener(*listeners_args)
        return accepted

    def _report_op_locked(
        self,
        task_id: int,
        success: bool,
        worker_id: int,
        exec_counters: dict[str, int] | None,
        err_message: str,
        model_version: int | None,
    ) -> tuple[bool, tuple | None, TaskReported]:
        """Apply a report; returns (accepted, done-listener arguments, its journal op)."""
        self._note_contact(worker_id)
        doing = self._doing.get(task_id)
        duration = self._clock() - doing.start_time if doing is not None else 0.0
        accepted, listeners_args = self._report_locked(
            task_id, success, worker_id, exec_counters, err_message, model_version, duration
        )
        op = TaskReported(
            task_id,
            worker_id,
            success,
            counters=exec_counters or None,
            error=err_message,
            model_version=model_version,
            duration=duration if accepted and success else 0.0,
        )
        return accepted, listeners_args, op

    def _report_locked(
        self,
        task_id: int,
        success: bool,
        worker_id: int,
        exec_counters: dict[str, int] | None,
        err_message: str,
        model_version: int | None,
        duration: float,
    ) -> tuple[bool, tuple | None]:
        listeners_args = None
        if model_version is not None:
            self._model_version_seen = max(self._model_version_seen, int(model_version))
        doing, counts = self._claim(task_id, worker_id, success)
        if doing is None:
            doing = self._take_back_requeued(task_id, worker_id, success)
            if doing is None:
                if self._dropped_report(task_id, worker_id):
                    return False, None
                self._stale_reports += 1
                logger.warning(
                    "Ignoring stale report for task %d from worker %d (%s); the task "
                    "belongs to another worker or is finished",
                    task_id,
                    worker_id,
                    "success" if success else "failure",
                )
                return False, None
        task = doing.task
        self._note_reported(worker_id, task, success)
        if not counts:
            logger.warning(
                "%s failed on worker %d; its other holder goes on with it: %s",
                task.describe(),
                worker_id,
                err_message,
            )
            return True, None
        for k, v in (exec_counters or {}).items():
            self._exec_counters[k] += int(v)
        if success:
            if not doing.inherited:  # its start time is the restart's, not the task's
                self._max_task_seconds = max(self._max_task_seconds, duration)
            self._complete_locked(task)
            listeners_args = (task, True, worker_id)
        else:
            task.retries += 1
            if task.retries > self.config.max_task_retries:
                self._tasks_failed += 1
                self._failed_message = (
                    f"{task.describe()} failed {task.retries} times (limit "
                    f"{self.config.max_task_retries} retries); last error from worker "
                    f"{worker_id}: {err_message or 'unknown'}"
                )
                logger.error("Job failed: %s", self._failed_message)
                listeners_args = (task, False, worker_id)
            else:
                self._tasks_retried += 1
                logger.warning(
                    "%s failed on worker %d (retry %d/%d): %s",
                    task.describe(),
                    worker_id,
                    task.retries,
                    self.config.max_task_retries,
                    err_message,
                )
                self._queue_for(task).append(task)
        return True, listeners_args

    def _fire_if_training_finished_locked(self) -> None:
        if not self._training_done_fired and self._training_finished_locked():
            self._fire_training_done_locked()

    def _take_back_requeued(self, task_id: int, worker_id: int, success: bool) -> Assignment | None:
        """A successful report from the previous owner of a task that was taken back but not
        yet handed to anyone else is still good work: accept it and unqueue the task."""
        if not success or self._last_owner.get(task_id) != worker_id or task_id in self._doing:
            return None
        for queue in (self._todo, self._eval_todo):
            for task in queue:
                if task.task_id == task_id:
                    queue.remove(task)
                    logger.info(
                        "Late success for re-queued %s from worker %d accepted",
                        task.describe(),
                        worker_id,
                    )
                    return Assignment(task, worker_id, self._clock())
        return None

    def _requeue_locked(self, task_ids: list[int]) -> None:
        """Put tasks back at the front of their queues (in ``task_id`` order)."""
        ids = sorted((i for i in task_ids if i in self._doing), reverse=True)
        for task_id in ids:
            task = self._doing.pop(task_id).task
            if not self._promote_backup(task_id):
                self._queue_for(task).appendleft(task)
        self._tasks_recovered += len(ids)
        if ids:
            self._record(TasksRequeued(tuple(ids)))

    def _queue_for(self, task: Task) -> collections.deque:
        return self._eval_todo if task.type == TaskType.EVALUATION else self._todo

    def _complete_locked(self, task: Task) -> None:
        if task.key in self._completed_keys:
            # Cannot happen through ownership checks; guard the invariant anyway.
            logger.warning("%s was already completed; not counted again", task.describe())
            return
        self._completed_keys.add(task.key)
        self._tasks_done += 1
        if task.type == TaskType.TRAINING:
            self._records_trained[task.epoch] += task.num_records
            if self.config.minibatch_size > 0:
                self._completed_steps += math.ceil(task.num_records / self.config.minibatch_size)
            if self.config.max_step > 0 and self._completed_steps >= self.config.max_step:
                self._reach_max_step_locked()
        elif task.type == TaskType.PREDICTION:
            self._records_predicted += task.num_records
        elif task.type == TaskType.TRAIN_END_CALLBACK:
            self._train_end_state = "done"

    def _reach_max_step_locked(self) -> None:
        if self._max_step_reached:
            return
        self._max_step_reached = True
        dropped = [t for t in self._todo if t.type == TaskType.TRAINING]
        self._todo = collections.deque(t for t in self._todo if t.type != TaskType.TRAINING)
        self._records_dropped += sum(t.num_records for t in dropped)
        logger.info(
            "max_step %d reached (%d steps done); %d queued training tasks dropped",
            self.config.max_step,
            self._completed_steps,
            len(dropped),
        )

    # ---- failures ------------------------------------------------------------------------
    def fail(self, message: str) -> None:
        """Mark the job failed from outside (e.g. no worker left); workers get NONE."""
        with self._lock:
            if not self._failed_message:
                self._failed_message = message
                self._record(TasksFailed(message))

    # ---- reporting -----------------------------------------------------------------------
    def summary(self) -> TaskSummary:
        with self._lock:
            epochs_created = self._epoch
            expected = self._records_per_epoch * epochs_created - self._records_dropped
            return TaskSummary(
                tasks_todo=len(self._todo) + len(self._eval_todo),
                tasks_doing=len(self._doing),
                tasks_done=self._tasks_done,
                tasks_retried=self._tasks_retried,
                tasks_recovered=self._tasks_recovered,
                tasks_failed=self._tasks_failed,
                stale_reports=self._stale_reports,
                epoch=self._epoch,
                records_trained=sum(self._records_trained.values()),
                records_expected=expected,
                records_trained_per_epoch=dict(self._records_trained),
                records_predicted=self._records_predicted,
                completed_steps=self._completed_steps,
                exec_counters=dict(self._exec_counters),
                backups_issued=self._backups_issued,
                backups_won=self._backups_won,
                backup_reports_dropped=self._backup_reports_dropped,
                finished=self._finished_locked(),
                failed_message=self._failed_message,
            )

    # ---- pausing dispatch (the PS set changes) ------------------------------------------
    def hold(self) -> None:
        """Hand out no task until ``release``: workers get WAIT and keep reporting the tasks
        they hold, so the tasks in flight drain (``in_flight`` reaches 0; a lost worker's go
        back to the queue as always). Not journaled: a restarted master never holds."""
        with self._lock:
            self._dispatch_held = True

    def release(self) -> None:
        with self._lock:
            self._dispatch_held = False

    @property
    def held(self) -> bool:
        return self._dispatch_held

    def in_flight(self) -> int:
        """Tasks handed out and not reported yet (their straggler backups included)."""
        with self._lock:
            return len(self._doing) + len(self._backups)

    def retire(self, worker_id: int) -> None:
        """``worker_id`` gets "no more tasks" from now on (released by --num_workers=auto; not
        journaled: a restarted master retires it again from the autoscaler's decisions)."""
        with self._lock:
            self._retired.add(worker_id)
            self._stragglers.forget(worker_id)

    def doing_workers(self) -> set[int]:
        with self._lock:
            held = list(self._doing.values()) + list(self._backups.values())
            return {d.worker_id for d in held}

    @property
    def model_version_seen(self) -> int:
        return self._model_version_seen

    @property
    def training_done_fired(self) -> bool:
        return self._training_done_fired
