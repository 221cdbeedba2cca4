"""The interface through which the master runs its replicas (parameter servers and workers).

The master never talks to Kubernetes or to the operating system directly: it describes each
replica as a :class:`LaunchSpec` and hands it to a :class:`Platform`. Two implementations
exist and are interchangeable:

* ``elasticdl.platform.local.LocalProcessPlatform``: every replica is a child process of the
  master (the default; laptops, CI, debugging);
* ``elasticdl.platform.kubernetes.KubernetesPlatform``: every replica is a pod (and a service).

Contract every platform keeps:

* ``address(type, id)`` is *stable*: the same replica type and id always get the same
  ``host:port`` for the lifetime of the platform, also across ``delete`` + ``launch``. This is
  how a relaunched PS is found again by the workers. The port part of that address is the port
  the replica must listen on (``LaunchSpec.port``).
* Lifecycle changes are reported asynchronously as :class:`ReplicaEvent` objects to every
  listener registered with ``add_event_listener``; listeners are called from a platform thread,
  one event at a time, in the order the platform observed them, and must not block for long.
* A replica that ends on its own reports ``Succeeded`` (exit code 0) or ``Failed`` (non-zero
  exit code; a process killed by signal N reports ``128 + N`` like a container runtime, so
  SIGKILL -> 137). A replica removed through ``delete`` (by the master) reports ``Deleted``;
  a replica removed by someone else (a preempting scheduler, a ``kubectl delete pod``) reports
  ``Deleted`` or ``Failed`` with ``reason`` set where the platform can tell
  (``"Preempted"``, ``"OOMKilled"``, ``"Evicted"``, ``"Error"``).
* A restarted master gets the same addresses back (``reserve_address``) and, where replicas
  outlive their master, adopts the running ones by the ``replica_identity`` recorded at
  launch (``adopt``) after ``reclaim`` stopped any launched unrecorded.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import TYPE_CHECKING, Callable

from elasticdl.common.types import ReplicaPhase, ReplicaType, replica_name

if TYPE_CHECKING:
    from elasticdl.common.job_spec import JobSpec
    from elasticdl.common.job_status import JobStatus

__all__ = [
    "EventListener",
    "Platform",
    "PlatformError",
    "PlatformTraits",
    "ReplicaEvent",
    "ReplicaPhase",
    "LaunchSpec",
    "ReplicaType",
    "replica_name",
]


# Exit code of a process killed by SIGKILL as reported by container runtimes (128 + 9). With
# reason != "OOMKilled" the master treats it as preemption and always relaunches the worker.
EXIT_CODE_KILLED = 137
# A worker told to stop by SIGTERM (128 + 15): only something outside sends it (a pod deleted,
# preempted, evicted, drained), so it reads like SIGKILL.
EXIT_CODE_TERMINATED = 143
STOPPED_FROM_OUTSIDE_EXIT_CODES = (EXIT_CODE_KILLED, EXIT_CODE_TERMINATED)
REASON_OOM_KILLED = "OOMKilled"
REASON_PREEMPTED = "Preempted"
REASON_ERROR = "Error"
REASON_DELETED_BY_MASTER = "DeletedByMaster"
# Its node stopped answering and the pod was removed without it (a machine that died).
REASON_NODE_LOST = "NodeLost"


@dataclasses.dataclass
class LaunchSpec:
    """What to run for one replica.

    The program is always a Python module of this package (``elasticdl.ps.main`` or
    ``elasticdl.worker.main``); the platform decides which interpreter runs it (the master's
    own ``sys.executable`` locally, ``python`` inside the image on Kubernetes), see
    :meth:`command`.
    """

    replica_type: ReplicaType
    replica_id: int
    module: str  # e.g. "elasticdl.worker.main"
    args: list[str]  # argv after "python -m <module>"
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    # Environment variables holding secrets (the job's secret): a platform passes them so that
    # they appear in no argv, log line or pod spec (Kubernetes: a Secret object it owns).
    secret_env: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)
    # Port the replica listens on (PS); None for replicas that serve nothing (workers).
    port: int | None = None
    # Kubernetes-style resource strings ("cpu=1,memory=4096Mi"); local processes ignore them.
    resource_request: str = ""
    resource_limit: str = ""
    # "high" / "low" / "" (platform default); Kubernetes maps it to a PriorityClass.
    priority: str = ""
    # Container image; "" = the platform's default for this replica type.
    image: str = ""

    def __post_init__(self) -> None:
        self.replica_type = ReplicaType(self.replica_type)
        if self.replica_id < 0:
            raise ValueError(f"replica_id must be >= 0, got {self.replica_id}")

    def command(self, python: str = "python") -> list[str]:
        """Full argv: ``[python, "-m", module, *args]``."""
        return [python, "-m", self.module, *self.args]


@dataclasses.dataclass(frozen=True)
class ReplicaEvent:
    """A lifecycle change of one replica, delivered to the platform's event listeners."""

    replica_type: ReplicaType
    replica_id: int
    phase: ReplicaPhase
    exit_code: int | None = None  # set for terminal phases when known
    reason: str = ""  # "OOMKilled", "Preempted", "Error", "DeletedByMaster", ...
    message: str = ""  # free text for humans (e.g. last log lines, pod status message)

    @property
    def looks_preempted(self) -> bool:
        """Stopped from outside (SIGKILL or SIGTERM / preemption / its node lost), not by
        running out of memory: nothing the replica did, so relaunching it uses no relaunch
        budget."""
        if self.reason in (REASON_PREEMPTED, REASON_NODE_LOST):
            return True
        return (
            self.exit_code in STOPPED_FROM_OUTSIDE_EXIT_CODES and self.reason != REASON_OOM_KILLED
        )


EventListener = Callable[[ReplicaEvent], None]


@dataclasses.dataclass(frozen=True)
class PlatformTraits:
    """What the master may assume about where its replicas run; it asks instead of testing
    which platform it has."""

    # Address the master's and the PS's servers listen on: loopback when every replica is a
    # process on this host (nothing else should reach them), all interfaces in pods.
    bind_host: str = "0.0.0.0"
    # Replicas run on the master's host: they share its CPUs (each worker sizes its thread
    # pools for its share) and its file system (local paths mean the same to them).
    shared_host: bool = False
    # Replicas can read and write the master's job directory (recovery checkpoints go there).
    shared_job_dir: bool = False
    # Other jobs' servers may hold the master's port (same host or host network): any free
    # port will do. A dedicated pod must get the port it was given.
    port_may_be_taken: bool = False
    # The client cannot call the master's port; it writes requests on the master (its pod's
    # annotations) for the master to read: master_annotations / annotate_master.
    requests_on_master: bool = False


class PlatformError(RuntimeError):
    """A platform operation failed (process could not start, API call refused, ...)."""


class Platform(abc.ABC):
    """Creates, deletes and watches the replicas of one job. Thread-safe."""

    def __init__(self, job_name: str) -> None:
        self.job_name = job_name
        self._listeners: list[EventListener] = []

    # ---- construction --------------------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def from_spec(cls, spec: "JobSpec") -> "Platform":
        """Build the platform for the job (``job_name``, ``job_dir``, ``namespace``, images,
        volumes, ...)."""

    @property
    def traits(self) -> PlatformTraits:
        return PlatformTraits()

    # ---- events --------------------------------------------------------------------------
    def add_event_listener(self, listener: EventListener) -> None:
        """Register ``listener``; it receives every :class:`ReplicaEvent` from now on."""
        self._listeners.append(listener)

    def _emit(self, event: ReplicaEvent) -> None:
        """Deliver ``event`` to all listeners (implementations call this from one thread)."""
        for listener in list(self._listeners):
            listener(event)

    # ---- replicas ------------------------------------------------------------------------
    @abc.abstractmethod
    def launch(self, spec: LaunchSpec) -> None:
        """Start the replica described by ``spec`` (asynchronously: it reports ``Pending`` /
        ``Running`` and later a terminal phase through events). Launching a (type, id) that
        is still alive raises :class:`PlatformError`."""

    @abc.abstractmethod
    def delete(
        self, replica_type: ReplicaType, replica_id: int, grace_seconds: float = 10.0
    ) -> None:
        """Stop the replica (graceful stop, then forced after ``grace_seconds``). Emits a
        ``Deleted`` event with reason ``DeletedByMaster`` once it is gone. No-op if it is
        not running."""

    @abc.abstractmethod
    def address(self, replica_type: ReplicaType, replica_id: int) -> str:
        """Stable ``host:port`` where this replica is reachable (see module docstring);
        the port is the one the replica must listen on."""

    @abc.abstractmethod
    def master_address(self, port: int) -> str:
        """``host:port`` under which replicas reach the master's gRPC server on ``port``."""

    def replica_pid(self, replica_type: ReplicaType, replica_id: int) -> int | None:
        """The process id of a replica running on this host, where that means something."""
        return None

    # ---- a restarted master ----------------------------------------------------------------
    @property
    def replicas_outlive_master(self) -> bool:
        """Whether replicas keep running when this master dies, for a restarted one to adopt."""
        return False

    def replica_identity(self, replica_type: ReplicaType, replica_id: int) -> dict | None:
        """JSON-able data that tells this very replica apart (for ``adopt``), or None."""
        return None

    def reserve_address(self, replica_type: ReplicaType, replica_id: int, address: str) -> None:
        """Make ``address(type, id)`` return ``address``, the one a previous master of this
        job handed out (platforms whose addresses derive from names need nothing)."""

    def reclaim(self, replica_type: ReplicaType, replica_id: int) -> int:
        """Stop every process of this replica that a previous master of this job started but
        did not live to record (it died between starting it and journaling it): it would be
        a duplicate. Returns how many were stopped."""
        return 0

    def adopt(self, spec: LaunchSpec, identity: dict | None) -> bool:
        """Watch the running replica ``identity`` names, launched as ``spec`` by a previous
        master of this job, as if this platform had launched it (``Running``, then events as
        usual); True if adopted. Otherwise emit the terminal event of how it ended (best
        knowledge) and return False."""
        self._emit(
            ReplicaEvent(
                spec.replica_type,
                spec.replica_id,
                ReplicaPhase.FAILED,
                EXIT_CODE_KILLED,
                REASON_ERROR,
                "not adopted: this platform's replicas end with their master",
            )
        )
        return False

    def retire(self, replica_type: ReplicaType, replica_id: int) -> None:
        """The job has no replica ``replica_id`` of this type any more (a smaller PS set): free
        what its id held besides its process (Kubernetes: its Service)."""

    def shared_dir_problem(self, path: str) -> str:
        """Why replicas launched now and later would not all read and write ``path`` as one
        directory (one line naming the fix), or "" when they do."""
        return ""

    # ---- requests written on the master (where the client cannot call it) ------------------
    def master_annotations(self) -> dict | None:
        """What the client wrote on the master (Kubernetes: its pod's annotations), or None
        where the client calls the master instead."""
        return None

    def annotate_master(self, annotations: dict) -> bool:
        """Merge ``annotations`` into the master's, where the client reads them."""
        return False

    def log_location(self, replica_type: ReplicaType, replica_id: int) -> str:
        """Where a human finds this replica's output (a file path, or a ``kubectl logs``
        command); shown in job status."""
        return ""

    def publish_status(self, status: "JobStatus") -> bool:
        """Make the job's status snapshot (what the master writes to ``status.json``)
        visible where this platform's users look (e.g. an annotation of the master pod).
        Called every few seconds; best effort. Returns whether it was published."""
        return False

    def mark_job_status(self, phase: str) -> bool:
        """Record the job's final phase (``Succeeded``/``Failed``/``Cancelled``) where it
        outlives the master (e.g. a master pod label). Best effort."""
        return False

    @abc.abstractmethod
    def shutdown(self, delete_all: bool = True) -> None:
        """Stop watching; with ``delete_all`` also delete every replica still alive.
        Idempotent."""
