"""The master's journal records, one dataclass per operation, and the owners that write them.

Three state owners journal their transitions, each into a journal of its own
(``master.journal``): the task manager, the evaluation service and the replica manager. Each
operation is a frozen dataclass here; :class:`JournaledOwner` is the base the owners share
(attach a sink, record an op), :func:`encode` and :func:`decode` the one way an op becomes a
journal record and back.

A record is a small JSON object: ``"o"`` names the operation, and each field travels under a
short key (``"w"`` the worker, ``"t"`` the task, ...) declared with the field, since the task
journal takes a record per RPC. A field equal to its default is left out. These are the keys
the journals of every earlier version used, so their records decode to the same operations
(``journal_compat_test`` replays one).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any, ClassVar, Iterable, Mapping

from elasticdl.master.journal import JournalError, JournalSink


def _key(key: str, default: Any = dataclasses.MISSING) -> Any:
    if isinstance(default, (dict, list)):
        raise TypeError("mutable defaults: use None")
    return dataclasses.field(default=default, metadata={"key": key})


@dataclasses.dataclass(frozen=True)
class JournalOp:
    KIND: ClassVar[str]


# ---- the task manager (master.task_manager, master.task_recovery) -----------------------------


@dataclasses.dataclass(frozen=True)
class TaskHandedOut(JournalOp):
    """``worker`` got ``task``; ``answering``: the report (task, success) of the
    report-and-get call it came with, so a repeat of that call gets the same task."""

    KIND = "g"
    worker: int = _key("w")
    task: int = _key("t")
    answering: tuple[int, bool] | None = _key("a", None)


@dataclasses.dataclass(frozen=True)
class TaskReported(JournalOp):
    """A report as the worker made it (accepted or stale); ``duration``: how long the accepted
    success took; ``handed_out``: the task the same report-and-get call handed out."""

    KIND = "r"
    task: int = _key("t")
    worker: int = _key("w")
    success: bool = _key("s")
    counters: dict[str, int] | None = _key("c", None)
    error: str = _key("e", "")
    model_version: int | None = _key("v", None)
    duration: float = _key("d", 0.0)
    handed_out: int | None = _key("g", None)


@dataclasses.dataclass(frozen=True)
class TasksRequeued(JournalOp):
    KIND = "q"
    tasks: tuple[int, ...] = _key("t")


@dataclasses.dataclass(frozen=True)
class TaskBackedUp(JournalOp):
    """``worker`` got a copy of ``task``, which a slow worker runs (master.stragglers): the
    first of them to report it counts it. ``answering``: as in :class:`TaskHandedOut`."""

    KIND = "b"
    worker: int = _key("w")
    task: int = _key("t")
    answering: tuple[int, bool] | None = _key("a", None)


@dataclasses.dataclass(frozen=True)
class TasksLeased(JournalOp):
    """``worker`` got ``tasks`` in one lease (``master.task_leases``); ``answering``: the
    results (task, success as 1/0, ...) of the call and ``call`` its number, so a repeat of
    it gets the same tasks; ``backup``: the one task is a copy of a slow worker's (as
    :class:`TaskBackedUp`)."""

    KIND = "l"
    worker: int = _key("w")
    tasks: tuple[int, ...] = _key("t")
    answering: tuple[int, ...] = _key("a", ())
    backup: bool = _key("b", False)
    call: int = _key("c", 0)


@dataclasses.dataclass(frozen=True)
class BackupsDropped(JournalOp):
    """The copies of ``tasks`` held by workers that died, hung or never claimed them."""

    KIND = "bd"
    tasks: tuple[int, ...] = _key("t")


@dataclasses.dataclass(frozen=True)
class EvaluationTasksCreated(JournalOp):
    KIND = "ev"
    model_version: int = _key("v")


@dataclasses.dataclass(frozen=True)
class EvaluationRoundDropped(JournalOp):
    KIND = "de"
    model_version: int = _key("v")


@dataclasses.dataclass(frozen=True)
class TrainingDone(JournalOp):
    KIND = "td"


@dataclasses.dataclass(frozen=True)
class TasksFailed(JournalOp):
    KIND = "f"
    message: str = _key("m")


# ---- the evaluation service (master.evaluation_service) --------------------------------------


@dataclasses.dataclass(frozen=True)
class RoundStarted(JournalOp):
    KIND = "start"
    model_version: int = _key("v")


@dataclasses.dataclass(frozen=True)
class RoundDone(JournalOp):
    """The round of ``model_version`` ended with ``metrics`` of ``result_version``."""

    KIND = "done"
    model_version: int = _key("v")
    result_version: int = _key("r")
    metrics: dict[str, Any] = _key("m")
    failed_tasks: int = _key("f")


@dataclasses.dataclass(frozen=True)
class VersionsSeen(JournalOp):
    KIND = "ver"
    model_version: int = _key("v")
    last_requested: int = _key("lr")


# ---- the replica manager (master.replica_manager) and each master's life (master.resume) -----


@dataclasses.dataclass(frozen=True)
class MasterStarted(JournalOp):
    """The first record of every master's life: its port, the digest of its spec, its pid."""

    KIND = "master"
    port: int = _key("port")
    spec_digest: str = _key("spec")
    pid: int = _key("pid")


@dataclasses.dataclass(frozen=True)
class ReplicaLaunching(JournalOp):
    """Written before the process or pod exists."""

    KIND = "launching"
    replica_type: str = _key("k")
    replica_id: int = _key("i")


@dataclasses.dataclass(frozen=True)
class ReplicaLaunched(JournalOp):
    KIND = "launch"
    replica_type: str = _key("k")
    replica_id: int = _key("i")
    relaunch_count: int = _key("rc")
    priority: str = _key("p")
    identity: dict[str, Any] | None = _key("id")
    address: str | None = _key("addr")


@dataclasses.dataclass(frozen=True)
class ReplicaEnded(JournalOp):
    KIND = "end"
    replica_type: str = _key("k")
    replica_id: int = _key("i")
    phase: str = _key("ph")
    exit_code: int | None = _key("x")
    reason: str = _key("r")
    replaced_by: int | None = _key("by")


@dataclasses.dataclass(frozen=True)
class PSFailures(JournalOp):
    KIND = "psf"
    ps_id: int = _key("i")
    failures: int = _key("n")


@dataclasses.dataclass(frozen=True)
class ScalingDecided(JournalOp):
    """A decision of ``--num_workers=auto`` (master.autoscaler) with the numbers behind it."""

    KIND = "scale"
    decision: dict[str, Any] = _key("d")

    @classmethod
    def of(cls, decision: dict[str, Any]) -> "ScalingDecided":
        return cls(dict(decision))


@dataclasses.dataclass(frozen=True)
class PSSetChanged(JournalOp):
    """The job's PS set is now ``generation`` of ``num_ps`` PS (master.ps_rescale), restored
    from the snapshot at model ``version``."""

    KIND = "ps_set"
    generation: int = _key("g")
    num_ps: int = _key("n")
    version: int = _key("v", 0)


@dataclasses.dataclass(frozen=True)
class JobFailed(JournalOp):
    KIND = "fail"
    message: str = _key("m")


def _table(*ops: type[JournalOp]) -> dict[str, type[JournalOp]]:
    return {op.KIND: op for op in ops}


TASK_OPS = _table(
    TaskHandedOut,
    TaskReported,
    TasksRequeued,
    TaskBackedUp,
    TasksLeased,
    BackupsDropped,
    EvaluationTasksCreated,
    EvaluationRoundDropped,
    TrainingDone,
    TasksFailed,
)
EVALUATION_OPS = _table(RoundStarted, RoundDone, VersionsSeen)
REPLICA_OPS = _table(
    MasterStarted,
    ReplicaLaunching,
    ReplicaLaunched,
    ReplicaEnded,
    PSFailures,
    JobFailed,
    ScalingDecided,
    PSSetChanged,
)


# ---- one encoder --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    key: str
    default: Any
    hint: Any


@functools.cache
def _fields(cls: type[JournalOp]) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    return tuple(
        _Field(f.name, f.metadata["key"], f.default, hints[f.name]) for f in dataclasses.fields(cls)
    )


def encode(op: JournalOp) -> dict[str, Any]:
    """The journal record of ``op``."""
    record: dict[str, Any] = {"o": op.KIND}
    for f in _fields(type(op)):
        value = getattr(op, f.name)
        if value is f.default or value == f.default:  # MISSING equals no value
            continue
        if type(value) is bool:
            value = int(value)
        elif type(value) is tuple:
            value = [int(v) if type(v) is bool else v for v in value]
        record[f.key] = value
    return record


def decode(record: Mapping[str, Any], table: Mapping[str, type[JournalOp]]) -> JournalOp:
    """The operation of a journal record; :class:`JournalError` for a record this version
    does not know (the journal belongs to another ElasticDL version or another owner)."""
    try:
        cls = table[record["o"]]
    except (KeyError, TypeError):
        raise JournalError(f"unknown journal record {dict(record)!r}") from None
    values = {}
    for f in _fields(cls):
        if f.key in record:
            values[f.name] = _typed(record[f.key], f.hint)
        elif f.default is dataclasses.MISSING:
            raise JournalError(f"journal record {dict(record)!r} has no {f.key!r} ({f.name})")
    return cls(**values)


def decode_all(
    records: Iterable[Mapping[str, Any]], table: Mapping[str, type[JournalOp]]
) -> list[JournalOp]:
    return [decode(r, table) for r in records]


def _typed(value: Any, hint: Any) -> Any:
    """JSON gives lists and 0/1 where the op has tuples and bools."""
    if hint is bool:
        return bool(value)
    if isinstance(value, list):
        args = typing.get_args(hint)
        item = next((a for a in args if typing.get_origin(a) is tuple), hint)
        kinds = typing.get_args(item)
        if len(kinds) == 2 and kinds[1] is bool:  # (int, bool)
            return (value[0], bool(value[1]))
        return tuple(value)
    return value


# ---- the owners' base --------------------------------------------------------------------


class JournaledOwner:
    """A state owner that journals its transitions: :meth:`attach_journal` once, then
    :meth:`_record` every operation before the call that caused it returns (so before the RPC
    is answered). While the owner replays its own journal nothing is recorded."""

    OPS: ClassVar[Mapping[str, type[JournalOp]]]
    _sink: JournalSink | None = None
    _replaying: bool = False

    def attach_journal(self, sink: JournalSink | None) -> None:
        """Record every transition from now on into ``sink``."""
        self._sink = sink

    def _record(self, op: JournalOp) -> None:
        if self._sink is not None and not self._replaying:
            self._sink.record(encode(op))

    def _decode(self, records: Iterable[Mapping[str, Any]]) -> list[JournalOp]:
        return decode_all(records, self.OPS)
