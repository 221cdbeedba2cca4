"""What the task manager hands out: task types, tasks and the ranges of records they cover,
the task manager's configuration and its counters.

A shard is ``name, [start, end)`` as the data reader cuts the input; :func:`split_shards` cuts
shards into tasks of ``records_per_task = minibatch_size * num_minibatches_per_task`` records.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, Iterable

from elasticdl.common.types import Shard


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
    # A worker this many times slower than its peers' median is a straggler (0: not handled).
    straggler_factor: float = 0.0

    def __post_init__(self) -> None:
        _check_records_per_task(self.records_per_task)
        if self.max_step > 0 and self.minibatch_size <= 0:
            raise ValueError("--max_step needs --minibatch_size > 0")
        if self.max_task_retries < 0:
            raise ValueError(f"max_task_retries must be >= 0, got {self.max_task_retries}")
        if self.straggler_factor != 0 and self.straggler_factor < 1:
            raise ValueError(
                f"straggler_factor must be 0 (off) or at least 1, got {self.straggler_factor}"
            )


@dataclasses.dataclass
class Assignment:
    """A task handed to a worker, and since when."""

    task: Task
    worker_id: int
    start_time: float
    inherited: bool = False  # handed out by a master that died (task_recovery)
    lease: int = 0  # its lease's first task id when handed out with others (task_leases)


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
    backups_issued: int = 0  # copies of slow workers' tasks handed to idle workers
    backups_won: int = 0  # ... whose copy was reported first
    backup_reports_dropped: int = 0  # reports of a backed-up task after its other holder's

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["records_trained_per_epoch"] = {
            str(k): v for k, v in self.records_trained_per_epoch.items()
        }
        return d


# Called with (task, success, worker_id) once per task when its outcome is final (accepted
# success, or dropped after too many failures).
DoneListener = Callable[[Task, bool, int], None]
