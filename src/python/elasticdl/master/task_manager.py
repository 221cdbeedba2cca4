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
  longest task seen so far)`` is taken back (``check_timeouts``) and its worker is reported to
  the caller, which deletes/relaunches it.

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
    if records_per_task <= 0:
        raise ValueError(
            f"records_per_task must be > 0, got {records_per_task}: "
            "set --minibatch_size and --num_minibatches_per_task to positive numbers"
        )
    out = []
    for obj in shards:
        shard = as_shard(obj)
        for start in range(shard.start, shard.end, records_per_task):
            out.append(Shard(shard.name, start, min(start + records_per_task, shard.end)))
    return out


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
        if self.records_per_task <= 0:
            raise ValueError(
                f"records_per_task must be > 0, got {self.records_per_task}: set "
                "--minibatch_size and --num_minibatches_per_task to positive numbers"
            )
        if self.max_step > 0 and self.minibatch_size <= 0:
            raise ValueError("--max_step needs --minibatch_size > 0")
        if self.max_task_retries < 0:
            raise ValueError(f"max_task_retries must be >= 0, got {self.max_task_retries}")


@dataclasses.dataclass
class _Doing:
    task: Task
    worker_id: int
    start_time: float


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
            return [t.task_id for t in tasks]

    # ---- hand out ------------------------------------------------------------------------
    def get(self, worker_id: int) -> Task:
        """Next task for ``worker_id``; WAIT_TASK if none now but more may come (others are
        still working); NO_MORE_TASKS when the job's work is over (or it failed)."""
        with self._lock:
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
        if self._training_done_fired or not self._training_ranges:
            return
        self._training_done_fired = True
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
    ) -> bool:
        """Record the outcome of ``task_id`` as reported by ``worker_id``.

        Returns True when the report was accepted, False when it was ignored as stale (the
        task is no longer owned by that worker, or it is unknown).
        """
        listeners_args = None
        with self._lock:
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
                    return False
            else:
                del self._doing[task_id]
            task = doing.task
            for k, v in (exec_counters or {}).items():
                self._exec_counters[k] += int(v)
            if success:
                self._max_task_seconds = max(
                    self._max_task_seconds, self._clock() - doing.start_time
                )
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
            if self._training_finished_locked():
                self._fire_training_done_locked()
        if listeners_args is not None:
            for listener in self._done_listeners:
                listener(*listeners_args)
        return True

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
            for task in sorted(mine, key=lambda t: t.task_id, reverse=True):
                del self._doing[task.task_id]
                self._queue_for(task).appendleft(task)
            self._tasks_recovered += len(mine)
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
