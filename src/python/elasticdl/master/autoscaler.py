"""``--num_workers=auto``: the master sizes a job by what another worker buys.

The job starts with ``--min_workers``. The autoscaler measures the job's throughput (records
of the tasks reported done per second, on the master's clock) over a window in which every
worker has finished its warm-up task (TensorFlow traces the model in the first one), then
decides, one step at a time:

* **add** a worker while the last one added raised the throughput by at least
  ``--autoscale_min_gain`` (the first step, from the minimum, is always tried), the job has
  fewer than ``--max_workers`` and no PS is saturated;
* **release** the last worker added when it raised the throughput by less: adding stopped
  paying, and the job stays one smaller for the rest of its run;
* **hold** at ``--max_workers``, or when a PS is saturated: its model lock busy, or its
  CPU used, for at least ``PS_SATURATED`` of the window (the PS report both every few
  seconds, elasticdl.ps.load_meter) - more workers would only queue on it;
* **not added**: a worker that is not running ``pending_timeout_s``
  (``--autoscale_pending_timeout``) after its launch (on Kubernetes: Pending, the cluster has
  no room for it), or that ended before its first task, counts as not added: it is deleted and
  the job stays as it is.

Every decision is logged with the numbers behind it, journaled (``ScalingDecided``, so a
restarted master keeps them and its released workers) and shown in the job status
(``autoscaling.decisions``). A worker is released gracefully: the task manager answers it "no
more tasks" (``TaskManager.retire``), it reports what it holds and exits; it is not relaunched.
The window is at least ``window_s`` long and holds at least ``window_tasks`` tasks per worker,
so a short, noisy window does not decide.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Callable, Protocol

from elasticdl.master.journal_ops import ScalingDecided
from elasticdl.master.tasks import Task

logger = logging.getLogger(__name__)

PS_SATURATED = 0.9  # a PS whose lock is busy, or whose CPUs are used, this much is saturated
ADD, RELEASE, HOLD, NOT_ADDED = "add", "release", "hold", "not_added"


@dataclasses.dataclass(frozen=True)
class AutoscalerConfig:
    min_workers: int
    max_workers: int
    min_gain: float = 0.1
    window_s: float = 10.0
    window_tasks: int = 3
    pending_timeout_s: float = 120.0
    ps_report_max_age_s: float = 10.0
    interval_s: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_workers <= self.max_workers:
            raise ValueError(
                f"need 1 <= min_workers <= max_workers, got {self.min_workers}, {self.max_workers}"
            )


class PSLoads:
    """The newest load each PS reported (the master's ``report_ps_load``)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._loads: dict[int, tuple[float, dict]] = {}

    def update(self, ps_id: int, load: dict) -> None:
        with self._lock:
            self._loads[ps_id] = (self._clock(), dict(load))

    def recent(self, max_age_s: float) -> dict[int, dict]:
        now = self._clock()
        with self._lock:
            return {i: load for i, (t, load) in self._loads.items() if now - t <= max_age_s}


class Workers(Protocol):
    """What the autoscaler needs of the replica manager."""

    def alive_workers(self) -> list[int]:
        ...

    def worker_phase(self, worker_id: int) -> str:
        ...

    def add_worker(self) -> int:
        ...

    def release_worker(self, worker_id: int, reason: str) -> None:
        ...

    def record_scaling(self, op: ScalingDecided) -> None:
        ...


class Autoscaler:
    def __init__(
        self,
        config: AutoscalerConfig,
        workers: Workers,
        task_manager,
        ps_loads: PSLoads,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        on_target: Callable[[int], None] | None = None,
    ) -> None:
        self.config = config
        self._workers = workers
        self._tm = task_manager
        self._ps_loads = ps_loads
        self._clock = clock
        self._wall = wall_clock
        self._on_target = on_target  # told the number of workers before one is added
        self._lock = threading.RLock()
        self._done_at: collections.deque[tuple[float, int]] = collections.deque()
        self._warm: set[int] = set()  # workers that finished a task
        self.target = config.min_workers
        self.decisions: list[dict] = []
        self._newest: int | None = None  # the worker added last, until it is warm
        self._added_at = 0.0
        self._window_start: float | None = None
        self._previous: tuple[int, float] | None = None  # (workers, records/s) measured last
        self._added: list[int] = []  # workers added, in order (the last one is released)
        self._settled = False
        self._measured = 0  # workers in the window of the decision being made
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        task_manager.add_done_listener(self._on_done)

    # ---- inputs --------------------------------------------------------------------------
    def _on_done(self, task: Task, success: bool, worker_id: int) -> None:
        if not success:
            return
        with self._lock:
            self._done_at.append((self._clock(), task.num_records))
            self._warm.add(worker_id)

    def _rate(self, since: float, until: float) -> tuple[float, int]:
        """(records per second, tasks) reported done in [since, until]."""
        while self._done_at and self._done_at[0][0] < since - 600:
            self._done_at.popleft()  # older than any window
        done = [n for t, n in self._done_at if since <= t <= until]
        return sum(done) / max(until - since, 1e-9), len(done)

    def _ps_summary(self) -> dict:
        loads = self._ps_loads.recent(self.config.ps_report_max_age_s)
        if not loads:
            return {}
        return {
            "cpu": round(max(x["cpu_fraction"] for x in loads.values()), 3),
            "lock_busy": round(max(x["lock_busy_fraction"] for x in loads.values()), 3),
            "lock_wait_ms": round(max(x["lock_wait_ms"] for x in loads.values()), 3),
        }

    # ---- the decisions -------------------------------------------------------------------
    def tick(self) -> None:
        """One look at the job; decides when a window is complete."""
        with self._lock:
            tm = self._tm
            if self._settled or tm.finished or (tm.has_training and tm.training_finished):
                return  # the rest is evaluation and the model's export
            now = self._clock()
            if self._newest is not None:
                if self._newest not in self._warm:
                    self._check_newest(now)
                    return
                self._newest = None
            alive = self._workers.alive_workers()
            if self._window_start is None:
                if alive and all(w in self._warm for w in alive):
                    self._window_start = now  # every worker past its warm-up from now
                return
            alive = [w for w in alive if w in self._warm]
            elapsed = now - self._window_start
            rate, tasks = self._rate(self._window_start, now)
            if elapsed < self.config.window_s:
                return
            if (
                tasks < self.config.window_tasks * max(1, len(alive))
                and elapsed < 6 * self.config.window_s
            ):
                return
            self._decide(len(alive), rate)

    def _check_newest(self, now: float) -> None:
        """The worker added last has not finished a task yet: does it count as not added?"""
        worker = self._newest
        phase = self._workers.worker_phase(worker)
        ended = phase in ("Succeeded", "Failed", "Deleted")
        if ended or now - self._added_at > self.config.pending_timeout_s:
            why = (
                f"worker {worker} ended ({phase}) before finishing a task"
                if ended
                else f"worker {worker} was not running a task {self.config.pending_timeout_s:.0f} s "
                f"after its launch ({phase}: the cluster has no room for it)"
            )
            self._workers.release_worker(worker, "not added (--num_workers=auto)")
            self._added.remove(worker)
            self.target -= 1
            self._newest = None
            self._settled = True
            self._record(NOT_ADDED, worker, None, f"{why}; the job stays at {self.target} workers")

    def _decide(self, workers: int, rate: float) -> None:
        self._measured = workers
        c = self.config
        ps = self._ps_summary()
        saturated = ps and max(ps["lock_busy"], ps["cpu"]) >= PS_SATURATED
        numbers = f"{rate:.1f} records/s with {workers} workers"
        ps_text = (
            f"PS lock busy {ps['lock_busy']:.0%}, CPU {ps['cpu']:.0%}" if ps else "no PS report"
        )
        previous, self._previous = self._previous, (workers, rate)
        gain = None
        if previous is not None and previous[1] > 0:
            gain = rate / previous[1] - 1
        if gain is not None and gain < c.min_gain and self._added:
            worker = self._added.pop()
            self._workers.release_worker(worker, "released (--num_workers=auto)")
            self.target -= 1
            self._settled = True
            self._record(
                RELEASE,
                worker,
                rate,
                f"{numbers} against {previous[1]:.1f} with {previous[0]}: worker {worker} "
                f"added {gain:+.0%} (< {c.min_gain:.0%}), released; {ps_text}",
                previous,
                gain,
                ps,
            )
            return
        grew = "" if gain is None else f" ({gain:+.0%} over {previous[0]} workers)"
        if self.target >= c.max_workers:
            self._settled = True
            self._record(
                HOLD,
                None,
                rate,
                f"{numbers}{grew}: at --max_workers; {ps_text}",
                previous,
                gain,
                ps,
            )
            return
        if saturated:
            self._settled = True
            self._record(
                HOLD,
                None,
                rate,
                f"{numbers}{grew}: a PS is saturated ({ps_text}); more workers would queue on it",
                previous,
                gain,
                ps,
            )
            return
        self.target += 1
        if self._on_target is not None:
            self._on_target(self.target)
        worker = self._workers.add_worker()
        self._added.append(worker)
        self._newest, self._added_at, self._window_start = worker, self._clock(), None
        self._record(
            ADD,
            worker,
            rate,
            f"{numbers}{grew}: adding worker {worker}; {ps_text}",
            previous,
            gain,
            ps,
        )

    def _record(self, action, worker, rate, reason, previous=None, gain=None, ps=None) -> None:
        decision = {
            "time": round(self._wall(), 3),
            "action": action,
            "workers": self.target,
            "worker": worker,
            "records_per_s": None if rate is None else round(rate, 2),
            "previous_records_per_s": None if previous is None else round(previous[1], 2),
            "gain": None if gain is None else round(gain, 4),
            "measured_workers": self._measured if rate is not None else None,
            "ps": ps or {},
            "settled": self._settled,
            "reason": reason,
        }
        self.decisions.append(decision)
        logger.info("Autoscaling: %s -> %d workers: %s", action, self.target, reason)
        self._workers.record_scaling(ScalingDecided.of(decision))

    # ---- a restarted master ----------------------------------------------------------------
    def resume(self, decisions: list[dict]) -> None:
        """Carry on from the decisions a previous master journaled: its target, its added and
        released workers; the next window is measured anew."""
        with self._lock:
            self.decisions = list(decisions)
            for d in decisions:
                self.target = d["workers"]
                self._settled = d.get("settled", False)
                if d["action"] == ADD:
                    self._added.append(d["worker"])
                elif d["action"] in (RELEASE, NOT_ADDED):
                    if d["worker"] in self._added:
                        self._added.remove(d["worker"])
                    self._workers.release_worker(d["worker"], f"{d['action']} (--num_workers=auto)")
                if d.get("records_per_s") is not None:
                    self._previous = (d["measured_workers"], d["records_per_s"])
            if decisions and decisions[-1]["action"] == ADD:
                self._newest, self._added_at = decisions[-1]["worker"], self._clock()

    # ---- running -----------------------------------------------------------------------
    def start(self) -> None:
        def loop():
            while not self._stop.wait(self.config.interval_s):
                try:
                    self.tick()
                except Exception:  # never end the job for a sizing decision
                    logger.exception("Autoscaling step failed")

        self._thread = threading.Thread(target=loop, name="autoscaler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def status(self) -> dict:
        with self._lock:
            return {
                "min_workers": self.config.min_workers,
                "max_workers": self.config.max_workers,
                "min_gain": self.config.min_gain,
                "target": self.target,
                "settled": self._settled,
                "ps": self._ps_summary(),
                "decisions": [dict(d) for d in self.decisions],
            }
