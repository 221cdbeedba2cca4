"""What ``status``/``list`` report about a job, independent of where it runs.

On the local platform the master writes these fields as JSON to ``<job_dir>/status.json``
(rewritten atomically as the job progresses); the Kubernetes backend fills the same dataclass
from the master pod. Parsing is tolerant: unknown keys are ignored and missing keys get
defaults, so a newer master and an older client still understand each other.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any


class JobPhase:
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"
    FINAL = (SUCCEEDED, FAILED, CANCELLED)


def is_final(phase: str) -> bool:
    return phase in JobPhase.FINAL


@dataclasses.dataclass
class ReplicaStatus:
    """One PS or worker (or the master) as the master sees it."""

    name: str = ""  # "worker-0", "ps-0", "master"
    type: str = ""  # "worker", "ps", "master"
    id: int = 0
    phase: str = ""
    exit_code: int | None = None
    restarts: int = 0
    pid: int | None = None  # local platform only
    message: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ReplicaStatus":
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        # Accept the platform's naming as well ("replica_type"/"replica_id", "relaunches").
        values.setdefault("type", str(data.get("replica_type", "")))
        if "id" not in values and "replica_id" in data:
            values["id"] = data["replica_id"]
        if "restarts" not in values and "relaunches" in data:
            values["restarts"] = data["relaunches"]
        replica = cls(**values)
        if not replica.name and replica.type:
            replica.name = f"{replica.type}-{replica.id}"
        return replica


@dataclasses.dataclass
class JobStatus:
    job_name: str
    platform: str = ""
    phase: str = JobPhase.PENDING
    model_version: int = 0
    tasks_todo: int = 0
    tasks_doing: int = 0
    tasks_done: int = 0
    tasks_retried: int = 0
    records_trained: int = 0
    records_expected: int = 0
    epoch: int = 0
    evaluation_metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    replicas: list[ReplicaStatus] = dataclasses.field(default_factory=list)
    message: str = ""
    created_at: float | None = None  # seconds since the epoch
    updated_at: float | None = None
    namespace: str = ""
    job_dir: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any], **overrides: Any) -> "JobStatus":
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known and v is not None}
        values.update({k: v for k, v in overrides.items() if v is not None})
        values["replicas"] = [
            r if isinstance(r, ReplicaStatus) else ReplicaStatus.from_dict(r)
            for r in values.get("replicas") or []
            if isinstance(r, (dict, ReplicaStatus))
        ]
        if not isinstance(values.get("evaluation_metrics", {}), dict):
            values["evaluation_metrics"] = {}
        for key in ("created_at", "updated_at"):
            if key in values and not isinstance(values[key], (int, float)):
                values[key] = _parse_time(values[key])
        values.setdefault("job_name", "")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def is_final(self) -> bool:
        return is_final(self.phase)

    @property
    def progress(self) -> str:
        """``"42%"`` from records (or tasks when records are unknown); ``"-"`` if unknown."""
        if self.records_expected > 0:
            return f"{min(100, 100 * self.records_trained // self.records_expected)}%"
        total = self.tasks_todo + self.tasks_doing + self.tasks_done
        if total > 0:
            return f"{100 * self.tasks_done // total}%"
        return "100%" if self.phase == JobPhase.SUCCEEDED else "-"


def _parse_time(value: Any) -> float | None:
    if isinstance(value, str):
        from datetime import datetime

        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def format_age(since: float | None, now: float | None = None) -> str:
    """kubectl-style age: 45s, 3m, 2h, 5d."""
    if since is None:
        return "-"
    seconds = max(0, int((now if now is not None else time.time()) - since))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 2 * 3600:
        return f"{seconds // 60}m"
    if seconds < 2 * 86400:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"
