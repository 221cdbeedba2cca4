"""``--num_workers=auto``: the master sizes a job by what another worker buys.

The job starts with ``--min_workers``. The autoscaler measures the job's throughput (records
of the tasks reported done per second, on the master's clock) and the CPU the job holds
(elasticdl.master.job_cpu: master + PS + workers, in cores) over a window in which every
worker has finished its warm-up task (TensorFlow traces the model in the first one), then
decides, one step at a time:

* **add** a worker while the last one added raised the throughput by at least the gain it
  must bring (the first step, from the minimum, is always tried), the job has fewer than
  ``--max_workers`` and no PS is saturated;
* **release** the last worker added when it raised the throughput by less: it did not pay,
  and the job stays one smaller for the rest of its run;
* **hold** at ``--max_workers``, or when a PS is saturated: its model lock busy, or its
  CPU used, for at least ``PS_SATURATED`` of the window (the PS report both every few
  seconds, elasticdl.ps.load_meter) - more workers would only queue on it;
* **not added**: a worker that is not running ``pending_timeout_s``
  (``--autoscale_pending_timeout``) after its launch (on Kubernetes: Pending, the cluster has
  no room for it), or that ended before its first task, counts as not added: it is deleted and
  the job stays as it is.

The gain a worker must bring (``required_gain``). By default (``min_gain`` None, the rule
``cpu_efficiency``) a worker must pay for its CPU: with ``R`` records/s on ``C`` cores before
it and ``R'`` on ``C'`` with it, records per CPU second do not fall when ``R'/C' >= R/C``,
that is when the gain ``R'/R - 1`` is at least the CPU it added relative to the job's CPU
before it, ``C'/C - 1`` (from one worker of 0.3 CPU with a master and a PS of 0.2 each to two:
0.3 / 0.7 = 43%). The rule is::

    required_gain = max(GAIN_FLOOR, C'/C - 1)

so where a worker's CPU is small next to the job's, it reduces to "adding stopped paying"
(``GAIN_FLOOR``, 10%: a smaller gain is within the noise of a window). Where the CPU is
unknown (pods without a CPU request) it is ``GAIN_FLOOR``, and the decision says so. With an
explicit ``--autoscale_min_gain`` (the rule ``throughput``) the required gain is that number
whatever the CPU: the job tracks throughput, as a user who wants the fastest job asks.

Every decision is logged with the numbers behind it (records/s, cores and records per CPU
second before and after, the required gain and why), journaled (``ScalingDecided``, so a
restarted master keeps them and its released workers) and shown in the job status
(``autoscaling.decisions``). A worker is released gracefully: the task manager answers it "no
more tasks" (``TaskManager.retire``), it reports what it holds and exits; it is not relaunched.
The window is at least ``window_s`` long and holds at least ``window_tasks`` tasks per worker,
so a short, noisy window does not decide: a rate counted in whole tasks is off by up to a task
per worker at each end, 10% at ten tasks a worker (jobs of large tasks reach that count after
``window_s``).

The first window, the baseline every later step is judged against, must also be steady: the
job may still be warming up (embedding tables filling in their first epoch, caches, the
pipeline's first files), and a baseline taken on that ramp makes the first worker added look
like a large gain. So it is measured again until two windows in a row agree within
``STEADY_TOLERANCE``, at most ``MAX_BASELINE_WINDOWS`` windows. This costs no CPU: the job runs
at its minimum meanwhile.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Callable, Protocol

from elasticdl.master.job_cpu import JobCPU
from elasticdl.master.journal_ops import ScalingDecided
from elasticdl.master.tasks import Task

logger = logging.getLogger(__name__)

PS_SATURATED = 0.9  # a PS whose lock is busy, or whose CPUs are used, this much is saturated
ADD, RELEASE, HOLD, NOT_ADDED = "add", "release", "hold", "not_added"
# The least gain a worker must bring whatever its CPU: a smaller one is a window's noise.
GAIN_FLOOR = 0.1
CPU_EFFICIENCY, THROUGHPUT = "cpu_efficiency", "throughput"  # the rules (module docstring)
# Baseline windows in a row whose rates differ by at most this are steady (module docstring).
STEADY_TOLERANCE = 0.15
MAX_BASELINE_WINDOWS = 6


@dataclasses.dataclass(frozen=True)
class AutoscalerConfig:
    min_workers: int
    max_workers: int
    min_gain: float | None = None  # None: the CPU-aware rule; a number: throughput tracking
    window_s: float = 10.0
    window_tasks: int = 10
    pending_timeout_s: float = 120.0
    ps_report_max_age_s: float = 10.0
    interval_s: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_workers <= self.max_workers:
            raise ValueError(
                f"need 1 <= min_workers <= max_workers, got {self.min_workers}, {self.max_workers}"
            )

    @property
    def rule(self) -> str:
        return CPU_EFFICIENCY if self.min_gain is None else THROUGHPUT


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
        cpu: JobCPU | None = None,
    ) -> None:
        self.config = config
        self._workers = workers
        self._tm = task_manager
        self._ps_loads = ps_loads
        self._clock = clock
        self._wall = wall_clock
        self._on_target = on_target  # told the number of workers before one is added
        self._cpu = cpu
        self._cpu_mark: object = None  # the CPU reading at the window's start
        self._lock = threading.RLock()
        self._done_at: collections.deque[tuple[float, int]] = collections.deque()
        self._warm: set[int] = set()  # workers that finished a task
        self.target = config.min_workers
        self.decisions: list[dict] = []
        self._newest: int | None = None  # the worker added last, until it is warm
        self._added_at = 0.0
        self._window_start: float | None = None
        # (workers, records/s, cores) measured last
        self._previous: tuple[int, float, float | None] | None = None
        self._added: list[int] = []  # workers added, in order (the last one is released)
        self._settled = False
        self._measured = 0  # workers in the window of the decision being made
        self._baselines: list[float] = []  # the rates of the baseline's windows so far
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
                    self._cpu_mark = self._cpu.mark() if self._cpu is not None else None
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
            if not self._steady_baseline(now, rate):
                return
            cores = self._cpu.cores(self._cpu_mark, len(alive)) if self._cpu is not None else None
            self._decide(len(alive), rate, cores)

    def _steady_baseline(self, now: float, rate: float) -> bool:
        """True once this window may decide: any window after the baseline; the baseline's
        when it agrees with the window before it (or after MAX_BASELINE_WINDOWS). Otherwise
        the next window starts now."""
        if self._previous is not None:
            return True
        before = self._baselines[-1] if self._baselines else None
        self._baselines.append(rate)
        if before is not None and before > 0 and abs(rate / before - 1) <= STEADY_TOLERANCE:
            return True
        if len(self._baselines) >= MAX_BASELINE_WINDOWS:
            return True
        if before is not None:
            logger.info(
                "Autoscaling: the baseline is not steady yet (%.1f then %.1f records/s); "
                "measuring again",
                before,
                rate,
            )
        self._window_start = now
        self._cpu_mark = self._cpu.mark() if self._cpu is not None else None
        return False

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

    def _required_gain(self, previous, cores: float | None) -> tuple[float, float | None, str]:
        """(the gain the last worker added must bring, the CPU it added relative to the job's
        CPU before it or None, why that gain)."""
        c = self.config
        before = previous[2] if previous is not None else None
        cpu_growth = cores / before - 1 if cores is not None and before else None
        if c.min_gain is not None:
            return c.min_gain, cpu_growth, "--autoscale_min_gain"
        if cpu_growth is None:
            return GAIN_FLOOR, None, "the floor: the job's CPU is unknown"
        if cpu_growth <= GAIN_FLOOR:
            return GAIN_FLOOR, cpu_growth, "the floor: its CPU is small next to the job's"
        return cpu_growth, cpu_growth, "its CPU's share: records per CPU s break even"

    def _decide(self, workers: int, rate: float, cores: float | None = None) -> None:
        self._measured = workers
        c = self.config
        ps = self._ps_summary()
        saturated = ps and max(ps["lock_busy"], ps["cpu"]) >= PS_SATURATED
        numbers = f"{rate:.1f} records/s with {workers} workers{_on_cpu(rate, cores)}"
        ps_text = (
            f"PS lock busy {ps['lock_busy']:.0%}, CPU {ps['cpu']:.0%}" if ps else "no PS report"
        )
        previous, self._previous = self._previous, (workers, rate, cores)
        gain = need = None
        m = {"rate": rate, "cores": cores, "previous": previous, "gain": None, "need": None}
        if previous is not None and previous[1] > 0:
            gain = rate / previous[1] - 1
            need, cpu_growth, why = self._required_gain(previous, cores)
            m.update(gain=gain, need=need)
            cost = "" if cpu_growth is None else f" for {cpu_growth:+.0%} CPU"
            against = (
                f"{numbers} against {previous[1]:.1f} with {previous[0]}"
                f"{_on_cpu(previous[1], previous[2])}"
            )
        if gain is not None and gain < need and self._added:
            worker = self._added.pop()
            self._workers.release_worker(worker, "released (--num_workers=auto)")
            self.target -= 1
            self._settled = True
            self._record(
                RELEASE,
                worker,
                m,
                f"{against}: worker {worker} added {gain:+.0%} records/s{cost}, below the "
                f"{need:.0%} it must bring ({why}), released; {ps_text}",
                ps,
            )
            return
        grew = (
            ""
            if gain is None
            else f" ({gain:+.0%} over {previous[0]} workers{cost}, >= {need:.0%}: {why})"
        )
        if self.target >= c.max_workers:
            self._settled = True
            self._record(HOLD, None, m, f"{numbers}{grew}: at --max_workers; {ps_text}", ps)
            return
        if saturated:
            self._settled = True
            self._record(
                HOLD,
                None,
                m,
                f"{numbers}{grew}: a PS is saturated ({ps_text}); more workers would queue on it",
                ps,
            )
            return
        self.target += 1
        if self._on_target is not None:
            self._on_target(self.target)
        worker = self._workers.add_worker()
        self._added.append(worker)
        self._newest, self._added_at, self._window_start = worker, self._clock(), None
        self._record(ADD, worker, m, f"{numbers}{grew}: adding worker {worker}; {ps_text}", ps)

    def _record(self, action, worker, m: dict | None, reason: str, ps=None) -> None:
        """``m``: the measurement behind the decision (None for a worker not added)."""
        m = m or {}
        rate, cores, previous = m.get("rate"), m.get("cores"), m.get("previous")
        decision = {
            "time": round(self._wall(), 3),
            "action": action,
            "workers": self.target,
            "worker": worker,
            "records_per_s": _round(rate, 2),
            "previous_records_per_s": None if previous is None else _round(previous[1], 2),
            "gain": _round(m.get("gain"), 4),
            "rule": self.config.rule,
            "required_gain": _round(m.get("need"), 4),
            "cpu": _round(cores, 3),
            "previous_cpu": None if previous is None else _round(previous[2], 3),
            "records_per_cpu_s": _round(_per_cpu(rate, cores), 2),
            "previous_records_per_cpu_s": (
                None if previous is None else _round(_per_cpu(previous[1], previous[2]), 2)
            ),
            "cpu_source": None if self._cpu is None else self._cpu.source,
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
                    self._previous = (d["measured_workers"], d["records_per_s"], d.get("cpu"))
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
                "rule": self.config.rule,
                "min_gain": self.config.min_gain,
                "cpu_source": None if self._cpu is None else self._cpu.source,
                "target": self.target,
                "settled": self._settled,
                "ps": self._ps_summary(),
                "decisions": [dict(d) for d in self.decisions],
            }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _per_cpu(rate: float | None, cores: float | None) -> float | None:
    return rate / cores if rate is not None and cores else None


def _on_cpu(rate: float, cores: float | None) -> str:
    """The CPU behind a rate, e.g. ' on 0.70 CPU (389 records per CPU s)'; '' if unknown."""
    if not cores:
        return ""
    return f" on {cores:.2f} CPU ({rate / cores:.0f} records per CPU s)"
