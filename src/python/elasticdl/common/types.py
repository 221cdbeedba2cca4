"""The words every part of a job shares: job types, strategies, platforms, phases, replica
types and data shards.

Each is spelled once here and imported by the client, the master, the platforms, the PS and the
workers, so a value written by one is understood by the others. String enums compare equal to
their values (``JobPhase.SUCCEEDED == "Succeeded"``) and format as them, so they go into JSON,
flags, labels and log lines unchanged. Standard library only: the light client imports this.
"""

from __future__ import annotations

import dataclasses
import enum


class JobType(enum.StrEnum):
    """What a job does; ``elasticdl train`` derives it from the data it is given."""

    TRAINING_ONLY = "training_only"
    TRAINING_WITH_EVALUATION = "training_with_evaluation"
    EVALUATION_ONLY = "evaluation_only"
    PREDICTION_ONLY = "prediction_only"

    @property
    def trains(self) -> bool:
        return self in (JobType.TRAINING_ONLY, JobType.TRAINING_WITH_EVALUATION)

    @property
    def evaluates(self) -> bool:
        return self in (JobType.TRAINING_WITH_EVALUATION, JobType.EVALUATION_ONLY)

    @property
    def predicts(self) -> bool:
        return self is JobType.PREDICTION_ONLY


class Strategy(enum.StrEnum):
    """How workers share the model: through parameter servers, or by allreducing gradients."""

    PARAMETER_SERVER = "ParameterServerStrategy"
    ALLREDUCE = "AllreduceStrategy"


class PlatformName(enum.StrEnum):
    """Where a job's replicas run."""

    LOCAL = "local"
    KUBERNETES = "kubernetes"


class JobPhase(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"

    @property
    def is_final(self) -> bool:
        return self in (JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED)


FINAL_JOB_PHASES = frozenset({JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED})


class ReplicaType(enum.StrEnum):
    MASTER = "master"
    PS = "ps"
    WORKER = "worker"


class ReplicaPhase(enum.StrEnum):
    """A replica's lifecycle as its platform reports it."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    DELETED = "Deleted"

    @property
    def is_terminal(self) -> bool:
        return self in (ReplicaPhase.SUCCEEDED, ReplicaPhase.FAILED, ReplicaPhase.DELETED)


def replica_name(job_name: str, replica_type: ReplicaType | str, replica_id: int) -> str:
    """``elasticdl-<job>-<type>-<id>``: a pod name on Kubernetes, a log-file stem locally."""
    return f"elasticdl-{job_name}-{ReplicaType(replica_type).value}-{replica_id}"


@dataclasses.dataclass(frozen=True)
class Shard:
    """Records ``[start, end)`` of the data unit ``name`` (usually a file path)."""

    name: str
    start: int
    end: int

    @property
    def num_records(self) -> int:
        return self.end - self.start
