"""Launches the job's parameter servers and workers through a Platform and keeps them alive.

Rules (the original pod manager's, plus PS recovery):

* **Worker ends with an error or disappears** (Failed, or Deleted by someone other than the
  master): its tasks go back to the queue at once (``task_manager.recover_tasks``), then a
  replacement is launched with a **new worker id** if relaunching is enabled and either

  - it was ended from outside (:func:`spares_budget`): preempted — reason ``Preempted`` (on
    Kubernetes read from the pod's Events too: the scheduler deleted it for a higher-priority
    pod), or killed with exit code 137 (SIGKILL) or 143 (SIGTERM: only something outside
    sends it) and the reason is not ``OOMKilled`` — or evicted
    (reason ``Evicted``: the kubelet, a drain or the taint manager removing it from a lost
    node; ``NodeLost``). That is not the worker's fault and never uses up the budget; where
    the platform names the cause the replica's status says ``preempted`` / ``evicted``.
    A *bare* kill (137 or 143, no cause named) is ambiguous: the container engine may report an
    out-of-memory kill that way. It spares the budget only while the lineage keeps working:
    after ``BARE_KILLS_SPARED`` bare kills with no task completed in between, the next one
    counts as a failure, so a worker that runs out of memory at every start is not
    relaunched forever. Or
  - the failed worker's lineage has been relaunched fewer than ``relaunch_on_worker_failure``
    times.

  A replacement inherits the lineage's relaunch count and priority.
* **Worker succeeds** (exit 0): it had no more work; nothing to do.
* **Worker waits** (Pending): the platform's reason why it is not placed (Kubernetes: the
  scheduler's ``Unschedulable`` "0/2 nodes are available: 2 Insufficient cpu.") is kept in
  its state for the job status; the job trains with the workers that run meanwhile.
* **Worker hangs** (a task exceeds the timeout, see TaskManager.check_timeouts): with
  ``relaunch_timeout_worker`` the master deletes it and the rules above apply.
* **PS ends in any way while the job runs**: relaunched with the **same id and address**, so
  workers find it again; it restores its shard from the newest checkpoint in its checkpoint
  directory (without checkpoints it starts empty and the workers push their model copy again).
  After ``max_ps_relaunches`` non-preemption failures of one PS the job fails. The relaunch
  runs beside the event thread (:mod:`elasticdl.master.relaunch_queue`): on Kubernetes it
  waits for the old pod to go, which for a lost node's pod takes minutes, and the other
  replicas' events are handled meanwhile. One relaunch per PS at a time; the PS's end is
  acted on once (a repeated end, or the previous life's end arriving while the next one is
  being launched, is ignored); a relaunch not begun when the job ends is dropped.
* **The job fails** when a task exceeded its retries, a PS cannot be kept alive, or no worker
  is left (all ended) while work remains.
* **``--num_workers=auto``** (master.autoscaler) adds workers (``add_worker``: a new id) and
  releases them (``release_worker``): a running one is told "no more tasks" and exits after
  what it holds, one not running yet (Pending) is deleted; a released worker is never
  relaunched. Its decisions are journaled here (``ScalingDecided``).
* **The master restarts** (docs/architecture.md): ``restore`` rebuilds the replica table,
  relaunch counts and the next worker id from the journal, ``adopt`` (instead of ``start``)
  takes over the replicas still running, applies the rules above to the ones that ended
  while no master watched, and stops (``Platform.reclaim``) one the dead master had started
  without recording the launch.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import math
import threading
import time
from typing import Callable

from elasticdl.master.journal_ops import (
    REPLICA_OPS,
    JobFailed,
    JournaledOwner,
    PSFailures,
    PSSetChanged,
    ReplicaEnded,
    ReplicaLaunched,
    ReplicaLaunching,
    ScalingDecided,
)
from elasticdl.master.relaunch_queue import RelaunchQueue
from elasticdl.master.task_manager import TaskManager
from elasticdl.platform.base import (
    REASON_DELETED_BY_MASTER,
    REASON_NODE_LOST,
    REASON_PREEMPTED,
    STOPPED_FROM_OUTSIDE_EXIT_CODES,
    LaunchSpec,
    Platform,
    PlatformError,
    ReplicaEvent,
    ReplicaPhase,
    ReplicaType,
)

logger = logging.getLogger(__name__)


class PriorityError(ValueError):
    pass


PREEMPTED, EVICTED = "preempted", "evicted"
# Bare kills (SIGKILL/SIGTERM, no cause named) a lineage may take in a row, no task completed
# in between, without using its relaunch budget. More than one: a worker killed from outside
# while still starting up (before its first task is done) is common under preemption churn.
BARE_KILLS_SPARED = 2
# Reasons of an eviction: the kubelet's or the Eviction API's, a lost node's.
_EVICTION_REASONS = ("Evicted", REASON_NODE_LOST)
# How long a PS of a replaced PS set may take to stop before it is killed (replace_ps_set).
RETIRED_PS_GRACE_S = 0.5
# How long stop() gives a relaunch under way to notice the platform is shut down.
RELAUNCH_STOP_WAIT_SECONDS = 10.0


def ended_from_outside(event: ReplicaEvent) -> str:
    """``"preempted"`` or ``"evicted"`` when the platform names who ended the replica from
    outside (what its status then says), else ``""``."""
    if event.reason in _EVICTION_REASONS:
        return EVICTED
    if event.reason == REASON_PREEMPTED:
        return PREEMPTED
    return ""


def spares_budget(event: ReplicaEvent) -> str:
    """Why the replica's end does not count against the relaunch budget (``""``: it does):
    named from outside, or killed like a preempted process (SIGKILL, not out of memory)."""
    return ended_from_outside(event) or (PREEMPTED if event.looks_preempted else "")


def parse_worker_priority(num_workers: int, value: str) -> dict[int, str]:
    """``--worker_pod_priority``: "" (platform default), "high", "low", or a fraction ``p`` in
    [0, 1]: ``ceil(p * num_workers)`` workers are high, the rest low, as in the original
    ElasticDL. The high ones are taken from both ends of the id range in turn (0, n-1, 1,
    n-2, ...), so a job scaled down from either end keeps some of each."""
    value = (value or "").strip()
    if value in ("", "high", "low"):
        return {i: value for i in range(num_workers)}
    try:
        fraction = float(value)
    except ValueError:
        fraction = -1.0
    if not 0.0 <= fraction <= 1.0:
        raise PriorityError(
            f"--worker_pod_priority={value!r}: use 'high', 'low' or a fraction in [0, 1] such as 0.5"
        )
    high = math.ceil(num_workers * fraction)
    # Alternate ends: the k-th pick is k//2 from the front (k even) or from the back (k odd).
    order = [k // 2 if k % 2 == 0 else num_workers - 1 - k // 2 for k in range(num_workers)]
    return {worker_id: ("high" if k < high else "low") for k, worker_id in enumerate(order)}


@dataclasses.dataclass
class ReplicaManagerConfig:
    num_ps: int
    num_workers: int
    relaunch_on_worker_failure: int = 1
    disable_relaunch: bool = False  # --aux_params disable_relaunch
    relaunch_timeout_worker: bool = False
    max_ps_relaunches: int = 3
    worker_priority: str = ""
    ps_priority: str = ""
    max_workers: int = 0  # --num_workers=auto: the most workers it may add up to

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"--num_workers must be >= 1, got {self.num_workers}")
        if self.num_ps < 0:
            raise ValueError(f"--num_ps_pods must be >= 0, got {self.num_ps}")


@dataclasses.dataclass
class ReplicaState:
    replica_type: ReplicaType
    replica_id: int
    phase: ReplicaPhase = ReplicaPhase.PENDING
    relaunch_count: int = 0  # relaunches in this replica's lineage before it
    exit_code: int | None = None
    reason: str = ""
    priority: str = ""
    replaced_by: int | None = None  # worker id of the replacement
    log: str = ""
    ended_by: str = ""  # "preempted" / "evicted": ended from outside
    # While Pending: why the platform has not placed it (reason, human message).
    waiting_reason: str = ""
    waiting_message: str = ""
    tasks_done: int = 0  # tasks this replica completed
    # Bare kills of this lineage since one of its workers last completed a task.
    bare_kills: int = 0
    # Its launch is under way (a PS relaunch may wait there for its previous life's pod to go),
    # and whether the platform reported on this life yet: an end reported while it is being
    # launched and before anything of it was heard is its previous life's.
    launching: bool = False
    heard: bool = False

    def to_dict(self) -> dict:
        return {
            "type": str(self.replica_type),
            "id": self.replica_id,
            "phase": str(self.phase),
            "relaunch_count": self.relaunch_count,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "replaced_by": self.replaced_by,
            "log": self.log,
        }


SpecBuilder = Callable[[int], LaunchSpec]


class ReplicaManager(JournaledOwner):
    OPS = REPLICA_OPS

    def __init__(
        self,
        platform: Platform,
        config: ReplicaManagerConfig,
        worker_spec: SpecBuilder,
        ps_spec: SpecBuilder,
        task_manager: TaskManager,
    ) -> None:
        self.platform = platform
        self.config = config
        self._worker_spec = worker_spec
        self._ps_spec = ps_spec
        self._tm = task_manager
        self._lock = threading.RLock()
        self._workers: dict[int, ReplicaState] = {}
        self._ps: dict[int, ReplicaState] = {}
        self._ps_failures: dict[int, int] = {}
        self._next_worker_id = config.num_workers
        self._deleting: dict[tuple[ReplicaType, int], str] = {}  # why the master deletes it
        self._stopping = False
        self._failed_message = ""
        self._changed = threading.Condition(self._lock)
        self._priorities = parse_worker_priority(
            max(config.num_workers, config.max_workers), config.worker_priority
        )
        self._released: set[int] = set()  # workers --num_workers=auto let go
        self.scaling: list[dict] = []  # its decisions, as journaled (restore)
        self._identities: dict[tuple[ReplicaType, int], dict | None] = {}
        self._unrecorded: set[tuple[ReplicaType, int]] = set()  # launching, never launched
        self._relaunches = RelaunchQueue()
        # PS of a set being replaced (replace_ps_set): their end is expected, not relaunched.
        self._retiring_ps: set[int] = set()
        self.ps_set: PSSetChanged | None = None  # the newest change of the PS set (restore)
        platform.add_event_listener(self._on_event)
        task_manager.add_done_listener(self._on_task_done)

    # ---- start / stop --------------------------------------------------------------------
    def start(self) -> None:
        """Launch all PS first (workers need them), then the workers."""
        for ps_id in range(self.config.num_ps):
            self._launch_ps(ps_id)
        for worker_id in range(self.config.num_workers):
            self._launch_worker(worker_id, relaunch_count=0, priority=self._priorities[worker_id])

    def begin_stop(self) -> None:
        """The job is ending: from now on no replica is relaunched (safe in a signal handler:
        one assignment, no lock)."""
        self._stopping = True

    def stop(self, delete_all: bool = True) -> None:
        """The job is over: no more relaunches; delete what is still running."""
        with self._lock:
            self._stopping = True
        self._relaunches.close()
        self.platform.shutdown(delete_all=delete_all)
        # A relaunch under way finds the platform shut down: let it end before the journal
        # closes.
        if not self.wait_relaunches(RELAUNCH_STOP_WAIT_SECONDS):
            logger.warning("A PS relaunch was still under way when the job ended")

    def wait_relaunches(self, timeout: float) -> bool:
        """Until no PS relaunch is under way or waiting; False after ``timeout`` seconds."""
        return self._relaunches.wait_idle(timeout)

    def _launch_worker(
        self, worker_id: int, relaunch_count: int, priority: str, bare_kills: int = 0
    ) -> None:
        spec = self._worker_spec(worker_id)
        spec.priority = priority or spec.priority
        with self._lock:
            self._workers[worker_id] = ReplicaState(
                ReplicaType.WORKER,
                worker_id,
                relaunch_count=relaunch_count,
                priority=spec.priority,
                log=self.platform.log_location(ReplicaType.WORKER, worker_id),
                bare_kills=bare_kills,
            )
        self._launch(spec)

    def _launch_ps(self, ps_id: int) -> None:
        spec = self._ps_spec(ps_id)
        spec.priority = spec.priority or self.config.ps_priority
        with self._lock:
            old = self._ps.get(ps_id)
            state = self._ps[ps_id] = ReplicaState(
                ReplicaType.PS,
                ps_id,
                relaunch_count=(old.relaunch_count + 1) if old else 0,
                priority=spec.priority,
                log=self.platform.log_location(ReplicaType.PS, ps_id),
                launching=True,
            )
        try:
            self._launch(spec)
        finally:
            with self._lock:
                state.launching = False

    def _relaunch_ps(self, ps_id: int) -> None:
        """Relaunch PS ``ps_id`` on the relaunch queue (see the module's docstring)."""
        if not self._relaunches.submit(ps_id, lambda: self._relaunch_ps_now(ps_id)):
            logger.info("PS %d not relaunched: the job is ending", ps_id)

    def _relaunch_ps_now(self, ps_id: int) -> None:
        if self._stopping:
            logger.info("PS %d not relaunched: the job is ending", ps_id)
            return
        if ps_id in self._retiring_ps or ps_id >= self.config.num_ps:
            logger.info("PS %d not relaunched: the PS set is being replaced", ps_id)
            return
        logger.info("Relaunching PS %d at %s", ps_id, self.platform.address(ReplicaType.PS, ps_id))
        self._launch_ps(ps_id)

    def _launch(self, spec: LaunchSpec) -> None:
        # Before the process exists: a master dying right after starting it leaves a trace.
        self._record(ReplicaLaunching(str(spec.replica_type), spec.replica_id))
        try:
            self.platform.launch(spec)
        except PlatformError as e:
            if self._stopping:  # the job ended while a relaunch was on its way
                return
            self._fail(f"cannot launch {spec.replica_type}-{spec.replica_id}: {e}")
            return
        key = (spec.replica_type, spec.replica_id)
        with self._lock:
            state = (self._ps if spec.replica_type == ReplicaType.PS else self._workers)[
                spec.replica_id
            ]
            identity = self.platform.replica_identity(*key)
            self._identities[key] = identity
            self._record(
                ReplicaLaunched(
                    str(spec.replica_type),
                    spec.replica_id,
                    state.relaunch_count,
                    state.priority,
                    identity,
                    self.platform.address(*key) if spec.port is not None else None,
                )
            )

    # ---- events --------------------------------------------------------------------------
    def _on_event(self, event: ReplicaEvent) -> None:
        with self._lock:
            table = self._ps if event.replica_type == ReplicaType.PS else self._workers
            state = table.get(event.replica_id)
            if state is None:
                logger.debug("Event for unknown replica ignored: %s", event)
                return
            if event.phase.is_terminal and (
                state.phase.is_terminal or state.launching and not state.heard
            ):
                # Its end was acted on already: a repeated end, or the previous life's end
                # while the next life is being launched. Acting again would relaunch it twice.
                logger.info(
                    "End of %s-%d already handled: %s", event.replica_type, event.replica_id, event
                )
                return
            state.heard = True
            state.phase = event.phase
            if event.phase == ReplicaPhase.PENDING:
                state.waiting_reason, state.waiting_message = event.reason, event.message
            else:
                state.waiting_reason = state.waiting_message = ""
            if event.phase.is_terminal:
                state.exit_code = event.exit_code
                state.reason = event.reason
                if event.reason != REASON_DELETED_BY_MASTER:
                    state.ended_by = ended_from_outside(event)
            why_deleted = self._deleting.pop((event.replica_type, event.replica_id), None)
            stopping = self._stopping
            # A PS of a replaced set: its end is journaled before ``replace_ps_set``, waiting on
            # this notification, journals the change and the new PS of the same id. Journaled
            # after them, a restarted master would read it as the new PS's end.
            retiring = (
                event.replica_type == ReplicaType.PS and event.replica_id in self._retiring_ps
            )
            if retiring and event.phase.is_terminal and not stopping:
                self._record_end(state)
            self._changed.notify_all()
        if not event.phase.is_terminal or stopping:
            return
        if not retiring:
            self._record_end(state)
        if (
            event.phase == ReplicaPhase.DELETED
            and event.reason == REASON_DELETED_BY_MASTER
            and why_deleted is None
        ):
            why_deleted = "deleted by master"
        if event.replica_type == ReplicaType.WORKER:
            self._on_worker_ended(state, event, why_deleted)
        elif retiring:
            logger.info("PS %d of the replaced PS set stopped", event.replica_id)
        else:
            self._on_ps_ended(state, event)

    def _on_worker_ended(
        self, state: ReplicaState, event: ReplicaEvent, why_deleted: str | None
    ) -> None:
        if event.phase == ReplicaPhase.SUCCEEDED:
            logger.info("Worker %d finished", state.replica_id)
            self._check_workers_left()
            return
        # Its tasks must not wait for anyone: back to the queue right away.
        self._tm.recover_tasks(state.replica_id)
        if state.replica_id in self._released:
            logger.info("Worker %d ended after it was released: not relaunched", state.replica_id)
            self._check_workers_left()
            return
        cause = why_deleted or (
            f"exit code {event.exit_code}" + (f", {event.reason}" if event.reason else "")
        )
        logger.warning("Worker %d ended abnormally (%s, %s)", state.replica_id, event.phase, cause)
        if event.message:
            logger.warning("Last output of worker %d:\n%s", state.replica_id, event.message)
        outside = spares_budget(event)
        bare_kills = 0 if state.tasks_done else state.bare_kills
        if outside and not ended_from_outside(event):
            bare_kills += 1
            if bare_kills > BARE_KILLS_SPARED:
                outside = ""
                logger.warning(
                    "Worker %d: killed %d times in a row before completing a task, no cause "
                    "named (an out-of-memory kill may be reported as a plain SIGKILL): "
                    "counted as a failure",
                    state.replica_id,
                    bare_kills,
                )
        preempted = bool(outside)
        if self.config.disable_relaunch:
            decision = "not relaunched: relaunch disabled (--aux_params disable_relaunch)"
        elif self._tm.finished:
            decision = "not relaunched: no work left"
        elif preempted:
            decision = f"relaunch ({outside}; does not use the relaunch budget)"
        elif state.relaunch_count < self.config.relaunch_on_worker_failure:
            decision = (
                f"relaunch {state.relaunch_count + 1}/{self.config.relaunch_on_worker_failure}"
            )
        else:
            decision = (
                f"not relaunched: relaunch budget of {self.config.relaunch_on_worker_failure} used "
                "(--relaunch_on_worker_failure)"
            )
        if not decision.startswith("relaunch"):
            logger.warning("Worker %d %s", state.replica_id, decision)
            self._check_workers_left()
            return
        with self._lock:
            new_id = self._next_worker_id
            self._next_worker_id += 1
            state.replaced_by = new_id
            self._record_end(state)
        count = state.relaunch_count if preempted else state.relaunch_count + 1
        logger.info("Worker %d: %s as worker %d", state.replica_id, decision, new_id)
        self._launch_worker(
            new_id, relaunch_count=count, priority=state.priority, bare_kills=bare_kills
        )

    def _on_task_done(self, task, success: bool, worker_id: int) -> None:
        if not success:
            return
        with self._lock:
            state = self._workers.get(worker_id)
            if state is not None:
                state.tasks_done += 1

    def _on_ps_ended(self, state: ReplicaState, event: ReplicaEvent) -> None:
        ps_id = state.replica_id
        logger.warning(
            "PS %d ended while the job runs (%s, exit code %s%s)",
            ps_id,
            event.phase,
            event.exit_code,
            f", {event.reason}" if event.reason else "",
        )
        if event.message:
            logger.warning("Last output of PS %d:\n%s", ps_id, event.message)
        if not spares_budget(event):
            self._ps_failures[ps_id] = self._ps_failures.get(ps_id, 0) + 1
            self._record(PSFailures(ps_id, self._ps_failures[ps_id]))
        if self._ps_failures.get(ps_id, 0) > self.config.max_ps_relaunches:
            self._fail(
                f"PS {ps_id} failed {self._ps_failures[ps_id]} times (exit code {event.exit_code}); "
                f"see {state.log or 'its log'}"
            )
            return
        self._relaunch_ps(ps_id)

    def _check_workers_left(self) -> None:
        with self._lock:
            alive = [w for w in self._workers.values() if not w.phase.is_terminal]
        if not alive and not self._tm.finished:
            self._fail("no worker left (all ended and none can be relaunched) while tasks remain")

    def _fail(self, message: str) -> None:
        with self._lock:
            if not self._failed_message:
                self._failed_message = message
                logger.error("Job failed: %s", message)
                self._record(JobFailed(message))
            self._changed.notify_all()
        self._tm.fail(message)

    # ---- actions from the master ---------------------------------------------------------
    def on_worker_timeout(self, worker_id: int) -> None:
        """A worker's task timed out (its tasks are already re-queued). With
        ``relaunch_timeout_worker`` delete it; the event then relaunches it."""
        if not self.config.relaunch_timeout_worker:
            return
        with self._lock:
            state = self._workers.get(worker_id)
            if state is None or state.phase.is_terminal:
                return
            self._deleting[(ReplicaType.WORKER, worker_id)] = "task timeout"
        logger.warning("Deleting hung worker %d", worker_id)
        self.platform.delete(ReplicaType.WORKER, worker_id)

    # ---- --num_workers=auto ----------------------------------------------------------------
    def add_worker(self) -> int:
        """Launch one more worker (a new id); returns its id."""
        with self._lock:
            worker_id = self._next_worker_id
            self._next_worker_id += 1
        self._launch_worker(
            worker_id, relaunch_count=0, priority=self._priorities.get(worker_id, "")
        )
        return worker_id

    def release_worker(self, worker_id: int, reason: str) -> None:
        """Let ``worker_id`` go for good: gracefully when it runs (no more tasks for it), by
        deleting it when it does not run yet."""
        with self._lock:
            self._released.add(worker_id)
            state = self._workers.get(worker_id)
            if state is None or state.phase.is_terminal:
                return
            pending = state.phase == ReplicaPhase.PENDING
            if pending:
                self._deleting[(ReplicaType.WORKER, worker_id)] = reason
        self._tm.retire(worker_id)
        if pending:
            self.platform.delete(ReplicaType.WORKER, worker_id)

    def worker_phase(self, worker_id: int) -> str:
        with self._lock:
            state = self._workers.get(worker_id)
            return str(state.phase) if state is not None else ""

    def record_scaling(self, op: ScalingDecided) -> None:
        self._record(op)

    # ---- changing the PS count (master.ps_rescale) -------------------------------------------
    def replace_ps_set(self, num_ps: int, op: PSSetChanged, timeout: float = 120.0) -> None:
        """Stop every PS, journal ``op``, then launch PS ``0..num_ps-1`` (the PS spec builder
        gives them the new count). The old PS are waited for until the platform reported each
        one's end (a new PS reuses an old one's id and address); raises ``PlatformError``
        after ``timeout`` seconds."""
        with self._lock:
            old = [i for i, s in self._ps.items() if not s.phase.is_terminal]
            gone = sorted(i for i in self._ps if i >= num_ps)
            self._retiring_ps.update(self._ps)
        # All at once, and with a short grace: their model is in the snapshot already, and a
        # PS's graceful gRPC stop waits out its whole grace while idle workers keep a channel
        # open to it (seconds of paused training for nothing).
        with concurrent.futures.ThreadPoolExecutor(max(1, len(old))) as pool:
            list(
                pool.map(
                    lambda ps_id: self.platform.delete(
                        ReplicaType.PS, ps_id, grace_seconds=RETIRED_PS_GRACE_S
                    ),
                    old,
                )
            )
        deadline = time.monotonic() + timeout
        with self._changed:
            while not all(self._ps[i].phase.is_terminal for i in old):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PlatformError(f"the old PS {old} did not stop in {timeout:.0f} s")
                self._changed.wait(min(left, 1.0))
            self._adopt_ps_set(op)
            self._record(op)
            self._retiring_ps.clear()
        for ps_id in gone:  # a smaller set: those ids' Services are not needed any more
            self.platform.retire(ReplicaType.PS, ps_id)
        for ps_id in range(num_ps):
            self._launch_ps(ps_id)

    def _retire_replaced_ps(self) -> None:
        """A restarted master after a change to fewer PS: the dead master may have died before
        it retired the ids the new set gave up (``replace_ps_set``); retiring is idempotent."""
        if self.ps_set is None:
            return
        with self._lock:
            gone = sorted(i for i in self._ps if i >= self.config.num_ps)
        for ps_id in gone:
            try:
                self.platform.retire(ReplicaType.PS, ps_id)
            except PlatformError as e:  # a leftover Service holds nothing the job needs
                logger.warning("PS %d of a replaced PS set not retired: %s", ps_id, e)

    # ---- queries -------------------------------------------------------------------------
    @property
    def failed_message(self) -> str:
        return self._failed_message

    def alive_workers(self) -> list[int]:
        with self._lock:
            return [i for i, w in self._workers.items() if not w.phase.is_terminal]

    def all_workers_exited(self, ignore: set[int] = frozenset()) -> bool:
        with self._lock:
            return all(w.phase.is_terminal for i, w in self._workers.items() if i not in ignore)

    def replicas(self) -> list[ReplicaState]:
        with self._lock:
            return [
                dataclasses.replace(s)
                for s in list(self._ps.values()) + list(self._workers.values())
            ]

    def wait_for_change(self, timeout: float) -> None:
        """Block until a replica changes phase or ``timeout`` seconds pass."""
        with self._changed:
            self._changed.wait(timeout)

    def wait_workers_exited(self, timeout: float, ignore: set[int] = frozenset()) -> bool:
        """Until every worker but those in ``ignore`` ended; False after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not self.all_workers_exited(ignore):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.wait_for_change(min(left, 1.0))
        return True

    # ---- journal / a restarted master ------------------------------------------------------
    def _record_end(self, state: ReplicaState) -> None:
        self._record(
            ReplicaEnded(
                str(state.replica_type),
                state.replica_id,
                str(state.phase),
                state.exit_code,
                state.reason,
                state.replaced_by,
            )
        )

    def restore(self, records: list[dict]) -> None:
        """Rebuild the replica table from the journal's records (before ``adopt``); the
        platform gets the PS addresses back (``reserve_address``)."""
        ops = self._decode(records)
        with self._lock:
            for op in ops:
                match op:
                    case ReplicaLaunching(kind, replica_id):
                        self._unrecorded.add((ReplicaType(kind), replica_id))
                    case ReplicaLaunched():
                        self._restore_launched(op)
                    case ReplicaEnded():
                        rtype = ReplicaType(op.replica_type)
                        table = self._ps if rtype == ReplicaType.PS else self._workers
                        state = table.get(op.replica_id)
                        if state is not None:
                            state.phase = ReplicaPhase(op.phase)
                            state.exit_code, state.reason = op.exit_code, op.reason
                            state.replaced_by = op.replaced_by
                            if op.reason != REASON_DELETED_BY_MASTER:
                                state.ended_by = ended_from_outside(
                                    ReplicaEvent(
                                        rtype, op.replica_id, state.phase, op.exit_code, op.reason
                                    )
                                )
                        if op.replaced_by is not None:
                            self._next_worker_id = max(self._next_worker_id, op.replaced_by + 1)
                    case PSFailures(ps_id, failures):
                        self._ps_failures[ps_id] = failures
                    case JobFailed(message):
                        self._failed_message = self._failed_message or message
                    case ScalingDecided(decision):
                        self.scaling.append(decision)
                    case PSSetChanged():
                        self._adopt_ps_set(op)

    def _adopt_ps_set(self, op: PSSetChanged) -> None:
        """The PS set ``op`` names becomes the job's, live (``replace_ps_set``) or restored
        from the journal: PS ``0..num_ps-1`` are new lives, not relaunches, with a failure
        budget of their own, none launched yet (a launch journaled later restores one;
        ``adopt`` launches those a dead master did not)."""
        self.ps_set = op
        self.config.num_ps = op.num_ps
        for ps_id in range(op.num_ps):
            self._ps.pop(ps_id, None)
            self._ps_failures.pop(ps_id, None)

    def _restore_launched(self, op: ReplicaLaunched) -> None:
        rtype, replica_id = ReplicaType(op.replica_type), op.replica_id
        self._unrecorded.discard((rtype, replica_id))
        table = self._ps if rtype == ReplicaType.PS else self._workers
        table[replica_id] = ReplicaState(
            rtype,
            replica_id,
            phase=ReplicaPhase.RUNNING,
            relaunch_count=op.relaunch_count,
            priority=op.priority,
            log=self.platform.log_location(rtype, replica_id),
        )
        self._identities[(rtype, replica_id)] = op.identity
        if op.address:
            self.platform.reserve_address(rtype, replica_id, op.address)
        if rtype == ReplicaType.WORKER:
            self._next_worker_id = max(self._next_worker_id, replica_id + 1)

    def adopt(self) -> None:
        """Instead of ``start`` after ``restore``: adopt every replica the journal says runs;
        the platform reports those that ended meanwhile, and the rules above apply to them.
        Replicas recorded as due but never launched (the old master died in between) are
        launched now."""
        with self._lock:
            running = [
                s
                for s in list(self._ps.values()) + list(self._workers.values())
                if not s.phase.is_terminal
            ]
            ended = [s for s in self._workers.values() if s.phase.is_terminal]
            failed = bool(self._failed_message)
        for key in sorted(self._unrecorded):  # would run twice: stop them first
            self.platform.reclaim(*key)
        self._retire_replaced_ps()
        for state in ended:  # its tasks, if the old master died before taking them back
            self._tm.recover_tasks(state.replica_id)
        if failed:
            return
        for ps_id in range(self.config.num_ps):
            if ps_id not in self._ps:
                self._launch_ps(ps_id)
        for state in running:
            key = (state.replica_type, state.replica_id)
            build = self._ps_spec if state.replica_type == ReplicaType.PS else self._worker_spec
            spec = build(state.replica_id)
            spec.priority = state.priority or spec.priority
            self.platform.adopt(spec, self._identities.get(key))
        for state in ended:  # a replacement decided but not launched
            new_id = state.replaced_by
            if new_id is not None and new_id not in self._workers:
                outside = state.exit_code in STOPPED_FROM_OUTSIDE_EXIT_CODES
                count = state.relaunch_count + (0 if outside else 1)
                self._launch_worker(new_id, relaunch_count=count, priority=state.priority)
        for worker_id in range(self.config.num_workers):
            if worker_id not in self._workers:
                self._launch_worker(
                    worker_id, relaunch_count=0, priority=self._priorities[worker_id]
                )
        with self._lock:
            ended_ps = [s for s in self._ps.values() if s.phase.is_terminal]
        for state in ended_ps:  # ended and its relaunch never made it
            if state.replica_id < self.config.num_ps:  # else: a PS set replaced it
                self._relaunch_ps(state.replica_id)
