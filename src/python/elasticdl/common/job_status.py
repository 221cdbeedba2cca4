"""A job's status: one type for the master that writes it and the clients that read it.

The master builds a :class:`JobStatus` from its task manager and replica manager, writes it as
JSON to ``<job_dir>/status.json`` (local platform) or publishes it in an annotation of its pod
(Kubernetes; :meth:`JobStatus.published`, its curves thinned), and answers
``get_job_status`` from it. The client reads it back with :meth:`JobStatus.from_json` /
:meth:`JobStatus.from_dict`. Reading is tolerant: unknown keys
are ignored and missing keys get defaults, so a newer master and an older client (or the
reverse) still understand each other. Standard library only.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any

from elasticdl.common.types import FINAL_JOB_PHASES, JobPhase


@dataclasses.dataclass
class ReplicaStatus:
    """One PS or worker as the master sees it."""

    name: str = ""  # "worker-0", "ps-0"
    type: str = ""  # "worker", "ps"
    id: int = 0
    phase: str = ""
    exit_code: int | None = None
    restarts: int = 0
    pid: int | None = None  # where replicas are processes on the master's host
    message: str = ""
    replaced_by: int | None = None  # the id of the worker that took over from this one
    tasks_done: int = 0  # tasks this replica (this life of it) completed
    log: str = ""  # where its output is (a file, or a kubectl command)
    # "preempted" / "evicted": ended from outside (relaunched without using the budget)
    ended_by: str = ""
    # While Pending: why it is not placed yet (Kubernetes: the scheduler's reason and message,
    # "Unschedulable", "0/2 nodes are available: 2 Insufficient cpu.")
    waiting_reason: str = ""
    waiting_message: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ReplicaStatus":
        replica = cls(**_known(cls, data))
        if not replica.name and replica.type:
            replica.name = f"{replica.type}-{replica.id}"
        return replica


@dataclasses.dataclass
class JobStatus:
    job_name: str = ""
    platform: str = ""
    job_type: str = ""
    phase: str = JobPhase.PENDING
    message: str = ""
    model_version: int = 0
    tasks_todo: int = 0
    tasks_doing: int = 0
    tasks_done: int = 0
    tasks_retried: int = 0
    tasks_recovered: int = 0
    tasks_failed: int = 0
    stale_reports: int = 0
    records_trained: int = 0
    records_expected: int = 0
    records_trained_per_epoch: dict[str, int] = dataclasses.field(default_factory=dict)
    records_predicted: int = 0
    epoch: int = 0
    num_epochs: int = 0
    evaluation_metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    # [{"model_version": V, "metrics": {...}}, ...], oldest first
    evaluation_history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # [{"model_version": V, "loss": L}, ...], oldest first: one sample per training task (the
    # mean of its minibatch losses), thinned by the master to at most MAX_LOSS_SAMPLES
    loss_history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    replicas: list[ReplicaStatus] = dataclasses.field(default_factory=list)
    # AllreduceStrategy: {"generation": G, "members": [worker ids]}
    rendezvous: dict[str, Any] | None = None
    # Workers much slower than their peers (master.stragglers): {"factor", "slow_workers":
    # [{"worker", "seconds_per_record", "times_median"}], "ever_slow": [ids], "backups_issued",
    # "backups_won", "tasks_withheld"}; empty when straggler handling is off
    stragglers: dict[str, Any] = dataclasses.field(default_factory=dict)
    # --num_workers=auto (master.autoscaler): {"min_workers", "max_workers", "target",
    # "decisions": [{"time", "action", "workers", "records_per_s", ..., "reason"}]}; empty
    # for a fixed number of workers
    autoscaling: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Changes of the PS count while the job runs (master.ps_rescale): {"num_ps", "generation",
    # "changes": [{"generation", "from_ps", "to_ps", "state", "version", "pause_s", "drain_s",
    # "snapshot_s", "swap_s", "error"}]}; empty for jobs without PS
    ps_scaling: dict[str, Any] = dataclasses.field(default_factory=dict)
    master: dict[str, Any] = dataclasses.field(default_factory=dict)  # {"pid", "port"}
    # Training speed over the master's recent window (master.throughput), not the job's
    # average, and the seconds left at that speed; None when unknown (no recent progress).
    records_per_second: float | None = None
    eta_seconds: float | None = None
    created_at: float | None = None  # seconds since the epoch
    updated_at: float | None = None
    namespace: str = ""
    job_dir: str = ""

    # ---- reading -----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any], **overrides: Any) -> "JobStatus":
        values = {k: v for k, v in _known(cls, data).items() if v is not None}
        values.update({k: v for k, v in overrides.items() if v is not None})
        values["replicas"] = [
            r if isinstance(r, ReplicaStatus) else ReplicaStatus.from_dict(r)
            for r in values.get("replicas") or []
            if isinstance(r, (dict, ReplicaStatus))
        ]
        for key in (
            "evaluation_metrics",
            "records_trained_per_epoch",
            "master",
            "stragglers",
            "autoscaling",
            "ps_scaling",
        ):
            if not isinstance(values.get(key, {}), dict):
                values[key] = {}
        for key in ("evaluation_history", "loss_history"):
            if not isinstance(values.get(key, []), list):
                values[key] = []
        for key in ("records_per_second", "eta_seconds"):
            if not isinstance(values.get(key), (int, float)) or isinstance(values.get(key), bool):
                values.pop(key, None)
        for key in ("created_at", "updated_at"):
            if key in values and not isinstance(values[key], (int, float)):
                values[key] = _parse_time(values[key])
        return cls(**values)

    @classmethod
    def from_json(cls, text: str, **overrides: Any) -> "JobStatus":
        data = json.loads(text)
        return cls.from_dict(data if isinstance(data, dict) else {}, **overrides)

    # ---- writing -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/YAML values (phases and types as their strings)."""
        return dataclasses.asdict(self, dict_factory=_plain_dict)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True, default=str)

    def published(self) -> dict[str, Any]:
        """:meth:`to_dict` for where space is scarce and rewritten every few seconds (the
        master pod's annotation on Kubernetes, under the API server's 256 KiB for all of a
        pod's annotations): the curves thinned to :data:`PUBLISHED_LOSS_SAMPLES` and
        :data:`PUBLISHED_EVALUATIONS` points, enough to draw them; no per-epoch counts."""
        data = self.to_dict()
        data.pop("records_trained_per_epoch", None)
        data["loss_history"] = thinned(data["loss_history"], PUBLISHED_LOSS_SAMPLES)
        data["evaluation_history"] = thinned(data["evaluation_history"], PUBLISHED_EVALUATIONS)
        return data

    # ---- derived -----------------------------------------------------------------------
    @property
    def is_final(self) -> bool:
        return self.phase in FINAL_JOB_PHASES

    @property
    def records_total(self) -> int:
        """The records the whole job trains: the master counts those of the epochs it created
        so far; those still to come are as many per epoch. 0 if unknown."""
        expected = self.records_expected
        if expected > 0 and self.num_epochs > self.epoch > 0:
            expected = expected * self.num_epochs // self.epoch
        return max(0, expected)

    @property
    def progress(self) -> str:
        """``"42%"`` from records (or tasks when records are unknown); ``"-"`` if unknown."""
        if self.records_expected > 0:
            return f"{min(100, 100 * self.records_trained // self.records_total)}%"
        total = self.tasks_todo + self.tasks_doing + self.tasks_done
        if total > 0:
            return f"{100 * self.tasks_done // total}%"
        return "100%" if self.phase == JobPhase.SUCCEEDED else "-"

    def workers(self) -> dict[str, list[ReplicaStatus]]:
        """The workers the job has now, by phase: ``{"Running": [...], "Pending": [...]}``
        (ended ones are not counted)."""
        found: dict[str, list[ReplicaStatus]] = {"Running": [], "Pending": []}
        for replica in self.replicas:
            if replica.type == "worker" and replica.phase in found:
                found[replica.phase].append(replica)
        return found

    @property
    def workers_summary(self) -> str:
        """``"2/4 (2 pending)"``: running / all the job has now; ``"-"`` without replicas."""
        workers = self.workers()
        running, pending = len(workers["Running"]), len(workers["Pending"])
        if not self.replicas or running + pending == 0:
            return "-"
        return f"{running}/{running + pending}" + (f" ({pending} pending)" if pending else "")

    @property
    def eta(self) -> str:
        """``"4m10s"`` at the current speed, ``"-"`` when unknown, ``""`` once final."""
        if self.is_final:
            return ""
        if self.eta_seconds is None:
            return "-"
        return format_seconds(self.eta_seconds)


def format_seconds(seconds: float) -> str:
    """``45s``, ``4m10s``, ``2h05m``."""
    seconds = int(round(max(0.0, seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


# How many loss samples a status keeps: enough for a curve, small enough to rewrite every
# couple of seconds (~50 KB of JSON).
MAX_LOSS_SAMPLES = 1000
# What a published status keeps of its curves (JobStatus.published): ~10 KB and ~8 KB of JSON.
PUBLISHED_LOSS_SAMPLES = 200
PUBLISHED_EVALUATIONS = 100


def thinned(samples: list[Any], limit: int) -> list[Any]:
    """At most ``limit`` (>= 2) of ``samples``, evenly spaced, the first and the last kept."""
    if len(samples) <= limit:
        return list(samples)
    step = (len(samples) - 1) / (limit - 1)
    return [samples[round(i * step)] for i in range(limit)]


@dataclasses.dataclass
class MetricsHistory:
    """A job's curves: training loss and evaluation metrics over model versions, oldest first.

    What the dashboard's ``GET /v1/jobs/{name}/metrics`` returns; built from a status so that
    every backend that reads a :class:`JobStatus` serves it."""

    job_name: str = ""
    phase: str = ""
    model_version: int = 0
    loss: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    evaluation: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, status: JobStatus) -> "MetricsHistory":
        return cls(
            job_name=status.job_name,
            phase=str(status.phase),
            model_version=status.model_version,
            loss=[s for s in status.loss_history if _is_sample(s, "loss")],
            evaluation=[e for e in status.evaluation_history if _is_sample(e, "metrics")],
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self, dict_factory=_plain_dict)


def _is_sample(item: Any, key: str) -> bool:
    return isinstance(item, dict) and "model_version" in item and key in item


def _plain_dict(items: list[tuple[str, Any]]) -> dict[str, Any]:
    return {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in items}


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _parse_time(value: Any) -> float | None:
    if isinstance(value, str):
        from datetime import datetime

        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None
