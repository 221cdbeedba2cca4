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
* **Bounded retries.** A task that *fails* (the worker reports an error) is retried up to
  ``max_task_retries`` times; then it is dropped and the job fails with a message naming the
  shard and the last error. A task taken back from a dead worker is not a failure of the task
  and does not consume a retry.
* **Hung workers.** A task running longer than ``max(timeout_floor_s, timeout_factor x the
  longest task seen so far)`` (the floor is ``--task_timeout``) is taken back
  (``check_timeouts``) and its worker is reported to the caller, which deletes/relaunches it
  with ``--relaunch_timeout_worker``; otherwise the worker's late report of it is ignored
  unless the task is still queued (then it counts, once). A stopped PS stalls every worker
  this way; the job goes on when it resumes.
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

Order of work: pending evaluation tasks first (they are pinned to a model version and should
finish quickly), then training/prediction tasks; a new epoch is created when the queue runs
dry; when all training is done a single TRAIN_END_CALLBACK task is issued (if
``saved_model_path`` is set) so one worker exports the model.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import math
import random
import threading
import time
from typing import Any, Callable, Iterable

from elasticdl.common.types import Shard
from elasticdl.master.journal import JournalError, JournalSink

logger = logging.getLogger(__name__)


class TaskType(enum.IntEnum):
    """Same numbers as ``elasticdl.proto.elasticdl_pb2.TaskType``."""

    NONE = 0
    TRAINING = 1
    EVALUATION = 2
    PREDICTION = 3
    WAIT = 4
    TRAIN_END_CALLBACK = 5


def as_shard(obj: Any) -> Shard:
    """Accept a Shard, any object with ``name/start/end`` (what data readers'
    ``create_shards()`` return) or a ``(name, start, end)`` tuple."""
    if isinstance(obj, Shard):
        return obj
    if hasattr(obj, "name") and hasattr(obj, "start") and hasattr(obj, "end"):
        shard = Shard(str(obj.name), int(obj.start), int(obj.end))
    else:
        name, start, end = obj
        shard = Shard(str(name), int(start), int(end))
    if shard.start < 0 or shard.end < shard.start:
        raise ValueError(f"invalid shard {shard}: need 0 <= start <= end")
    return shard


def split_shards(shards: Iterable[Any], records_per_task: int) -> list[Shard]:
    """Cut each shard into ranges of at most ``records_per_task`` records (last one shorter).

    ``("f1", 0, 10)`` with 3 records per task -> ``[0,3), [3,6), [6,9), [9,10)``.
    """
    _check_records_per_task(records_per_task)
    out = []
    for obj in shards:
        shard = as_shard(obj)
        for start in range(shard.start, shard.end, records_per_task):
            out.append(Shard(shard.name, start, min(start + records_per_task, shard.end)))
    return out


def _check_records_per_task(records_per_task: int) -> None:
    if records_per_task <= 0:
        raise ValueError(
            f"records_per_task must be > 0, got {records_per_task}: "
            "set --minibatch_size and --num_minibatches_per_task to positive numbers"
        )


@dataclasses.dataclass
class Task:
    task_id: int
    type: TaskType
    shard: Shard = Shard("", 0, 0)
    epoch: int = 0  # 1-based for training tasks; 0 for others
    model_version: int = -1  # evaluation tasks: the version to evaluate (-1 = latest)
    extended_config: dict[str, str] = dataclasses.field(default_factory=dict)
    retries: int = 0  # failures reported so far

    @property
    def num_records(self) -> int:
        return self.shard.num_records

    @property
    def key(self) -> tuple:
        """Identity of the work, stable across re-queues; used for exactly-once accounting."""
        return (self.type, self.epoch, self.model_version, self.shard)

    def to_pb(self, model_version: int | None = None):
        from elasticdl.proto import elasticdl_pb2 as pb

        msg = pb.Task(
            task_id=self.task_id,
            type=int(self.type),
            model_version=self.model_version if model_version is None else model_version,
            epoch=self.epoch,
        )
        msg.shard.name = self.shard.name
        msg.shard.start = self.shard.start
        msg.shard.end = self.shard.end
        msg.extended_config.update(self.extended_config)
        return msg

    def describe(self) -> str:
        s = self.shard
        return f"task {self.task_id} ({self.type.name.lower()} {s.name}[{s.start}:{s.end}])"

    def to_state(self) -> list:
        s = self.shard
        return [
            self.task_id,
            int(self.type),
            s.name,
            s.start,
            s.end,
            self.epoch,
            self.model_version,
            self.retries,
            self.extended_config,
        ]

    @classmethod
    def from_state(cls, v: list) -> "Task":
        return cls(v[0], TaskType(v[1]), Shard(v[2], v[3], v[4]), v[5], v[6], dict(v[8]), v[7])


WAIT_TASK = Task(task_id=0, type=TaskType.WAIT)
NO_MORE_TASKS = Task(task_id=0, type=TaskType.NONE)


@dataclasses.dataclass
class TaskManagerConfig:
    records_per_task: int
    num_epochs: int = 1  # <= 0: train until max_step (or forever)
    minibatch_size: int = 0  # needed for max_step: steps of a task = ceil(records / minibatch)
    max_step: int = 0  # 0 = no limit
    max_task_retries: int = 3
    saved_model_path: str = ""  # non-empty -> one TRAIN_END_CALLBACK task after training
    shuffle: bool = False  # shuffle the task order of each training epoch
    seed: int = 0
    timeout_floor_s: float = 300.0
    timeout_factor: float = 3.0

    def __post_init__(self) -> None:
        _check_records_per_task(self.records_per_task)
        if self.max_step > 0 and self.minibatch_size <= 0:
            raise ValueError("--max_step needs --minibatch_size > 0")
        if self.max_task_retries < 0:
            raise ValueError(f"max_task_retries must be >= 0, got {self.max_task_retries}")


@dataclasses.dataclass
class _Doing:
    task: Task
    worker_id: int
    start_time: float
    inherited: bool = False  # handed out by a master that died (see resume_after_restart)


@dataclasses.dataclass
class TaskSummary:
    """Counters for job status and the end-of-job report."""

    tasks_todo: int
    tasks_doing: int
    tasks_done: int
    tasks_retried: int  # re-queued after a reported failure
    tasks_recovered: int  # taken back from dead / hung workers
    tasks_failed: int  # dropped after exceeding max_task_retries
    stale_reports: int  # late reports ignored (exactly-once)
    epoch: int
    records_trained: int
    records_expected: int
    records_trained_per_epoch: dict[int, int]
    records_predicted: int
    completed_steps: int
    exec_counters: dict[str, int]
    finished: bool
    failed_message: str

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["records_trained_per_epoch"] = {
            str(k): v for k, v in self.records_trained_per_epoch.items()
        }
        return d


# Called with (task, success, worker_id) once per task when its outcome is final (accepted
# success, or dropped after too many failures).
DoneListener = Callable[[Task, bool, int], None]


class TaskManager:
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
        self._doing: dict[int, _Doing] = {}
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

        self._sink: JournalSink | None = None
        self._replaying = False
        self.inherited_grace_s = 10.0
        self._contact: dict[int, float] | None = None  # worker -> first call after a restart

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
            self._record({"o": "ev", "v": model_version})
            return [t.task_id for t in tasks]

    def drop_evaluation_round(self, model_version: int) -> None:
        """Forget the evaluation tasks of ``model_version`` (done or not): a restarted master
        lost that round's buffered outputs and evaluates the version again."""
        with self._lock:
            self._drop_evaluation_round_locked(model_version)
            self._record({"o": "de", "v": model_version})

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
                self._record({"o": "g", "w": worker_id, "t": task.task_id})
            self._maybe_snapshot()
            return task

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

        One journal record for both (a report op with the task handed out, ``"g"``), written
        under the lock like every op, so ops are recorded in the order they happened."""
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
            if task is None:
                task = self._get_locked(worker_id)
                if task.task_id:
                    self._last_exchange[worker_id] = (task_id, success, task.task_id)
                    if op is None:
                        op = {"o": "g", "w": worker_id, "t": task.task_id}
                        op["a"] = [task_id, int(success)]
                    else:
                        op["g"] = task.task_id
            if op is not None:
                self._record(op)
            self._maybe_snapshot()
        if listeners_args is not None:
            for listener in self._done_listeners:
                listener(*listeners_args)
        return task

    def _get_locked(self, worker_id: int) -> Task:
        if self._failed_message:
            return NO_MORE_TASKS
        task = None
        if self._eval_todo:
            task = self._eval_todo.popleft()
        elif self._todo:
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
            return WAIT_TASK if self._doing else NO_MORE_TASKS
        self._doing[task.task_id] = _Doing(task, worker_id, self._clock())
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
            return  # replay: the "td" op sets the flag; listeners ran in the first life
        self._training_done_fired = True
        self._record({"o": "td"})
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
    ) -> tuple[bool, tuple | None, dict]:
        """Apply a report; returns (accepted, done-listener arguments, its journal op)."""
        self._note_contact(worker_id)
        doing = self._doing.get(task_id)
        duration = self._clock() - doing.start_time if doing is not None else 0.0
        accepted, listeners_args = self._report_locked(
            task_id, success, worker_id, exec_counters, err_message, model_version, duration
        )
        op = {"o": "r", "t": task_id, "w": worker_id, "s": int(success)}
        if exec_counters:
            op["c"] = exec_counters
        if err_message:
            op["e"] = err_message
        if model_version is not None:
            op["v"] = model_version
        if accepted and success:
            op["d"] = duration
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
        doing = self._doing.get(task_id)
        if doing is None or doing.worker_id != worker_id:
            doing = self._take_back_requeued(task_id, worker_id, success)
            if doing is None:
                self._stale_reports += 1
                logger.warning(
                    "Ignoring stale report for task %d from worker %d (%s); the task "
                    "belongs to another worker or is finished",
                    task_id,
                    worker_id,
                    "success" if success else "failure",
                )
                return False, None
        else:
            del self._doing[task_id]
        task = doing.task
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

    def _take_back_requeued(self, task_id: int, worker_id: int, success: bool) -> _Doing | None:
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
                    return _Doing(task, worker_id, self._clock())
        return None

    def _requeue_locked(self, task_ids: list[int]) -> None:
        """Put tasks back at the front of their queues (in ``task_id`` order)."""
        ids = sorted((i for i in task_ids if i in self._doing), reverse=True)
        for task_id in ids:
            task = self._doing.pop(task_id).task
            self._queue_for(task).appendleft(task)
        self._tasks_recovered += len(ids)
        if ids:
            self._record({"o": "q", "t": ids})

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

    def fail(self, message: str) -> None:
        """Mark the job failed from outside (e.g. no worker left); workers get NONE."""
        with self._lock:
            if not self._failed_message:
                self._failed_message = message
                self._record({"o": "f", "m": message})

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
                finished=self._finished_locked(),
                failed_message=self._failed_message,
            )

    def doing_workers(self) -> set[int]:
        with self._lock:
            return {d.worker_id for d in self._doing.values()}

    @property
    def model_version_seen(self) -> int:
        return self._model_version_seen

    @property
    def training_done_fired(self) -> bool:
        return self._training_done_fired

    # ---- journal ---------------------------------------------------------------------------
    def attach_journal(self, sink: JournalSink | None) -> None:
        """Record every transition from now on into ``sink`` (see the module docstring)."""
        self._sink = sink

    def _record(self, op: dict) -> None:
        if self._sink is None or self._replaying:
            return
        self._sink.record(op)

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
                self._doing[task.task_id] = _Doing(task, worker_id, now)
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
                for op in records:
                    self._apply_locked(op)
                    n += 1
            except (KeyError, TypeError, ValueError) as e:
                raise JournalError(f"journal op {n + 1} cannot be replayed: {e!r}") from e
            finally:
                self._replaying = False
        return n

    def _apply_locked(self, op: dict) -> None:
        kind = op["o"]
        if kind == "g":
            task = self._get_locked(op["w"])
            if task.task_id != op["t"]:
                raise JournalError(
                    f"journal op {op}: this job hands out task {task.task_id} there; the "
                    "journal was written for other data or another ElasticDL version"
                )
            if "a" in op:
                self._last_exchange[op["w"]] = (op["a"][0], bool(op["a"][1]), op["t"])
        elif kind == "r":
            self._report_locked(
                op["t"],
                bool(op["s"]),
                op["w"],
                op.get("c"),
                op.get("e", ""),
                op.get("v"),
                op.get("d", 0.0),
            )
            if "g" in op:  # report_and_get: the task handed out in the same call
                self._apply_locked({"o": "g", "w": op["w"], "t": op["g"], "a": [op["t"], op["s"]]})
        elif kind == "q":
            self._requeue_locked(op["t"])
        elif kind == "ev":
            self.create_evaluation_tasks(op["v"])
        elif kind == "de":
            self._drop_evaluation_round_locked(op["v"])
        elif kind == "td":
            self._training_done_fired = True
        elif kind == "f":
            self._failed_message = self._failed_message or op["m"]
        else:
            raise JournalError(f"unknown journal op {kind!r}")

    # ---- after a restart -------------------------------------------------------------------
    def resume_after_restart(self) -> list[int]:
        """Called once after replay by a restarted master: every task handed out before the
        crash stays its worker's (counted when it reports), timed from now. Returns their ids."""
        with self._lock:
            now = self._clock()
            for d in self._doing.values():
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
