"""Workers much slower than their peers (a throttled node, a noisy neighbour): how fast each
worker goes, judged from its task reports, and what that allows near the end of the data.

**Pace.** A worker's seconds per record: the time between its reports (or since it started
working after having nothing) over the records of the training or prediction tasks reported,
taken over spans of at least ``PACE_MIN_SECONDS`` of work (consecutive reports add up until
then) and smoothed over its last spans (EWMA). The master measures it on its own clock, so
the worker's look-ahead (it holds the next task while it runs one) does not distort it. A
worker's first task is its warm-up (TensorFlow traces the model: seconds, where a task takes
a fraction of one) and is not measured. Once a worker has run a task for ``PACE_MIN_SECONDS``,
``elapsed / records of that task`` is a lower bound of its pace: a worker that stalls is seen
before it reports. Nothing shorter counts: a worker several times slower than its peers for
a fraction of a second (a scheduler hiccup, a garbage collection, a checkpoint, a step traced
again) is not a straggler, and the bound of a task just begun would make its worker look
faster than any peer.

**Slow.** A worker whose pace is at least ``factor`` times the median of its peers' (the other
workers with a pace) is slow.

**Its share.** Near the end of the data (no epoch left to create) a slow worker gets a new task
only while its share of the queued records, in proportion to its speed among all workers with
a pace, covers the tasks it holds and one more: otherwise the others would finish everything
else before it finished that task, and the job would wait for it.

What the task manager does with this (hands out, backs up, withholds) is in
``master.task_manager``; nothing here is journaled: a restarted master measures anew.
"""
from __future__ import annotations

import dataclasses
import statistics

# The shortest span of work a pace is judged from.
PACE_MIN_SECONDS = 2.0


@dataclasses.dataclass
class _Pace:
    seconds_per_record: float | None = None
    since: float = 0.0  # its last report, or when it got work after having none
    tasks: int = 0
    span_seconds: float = 0.0  # measured work not yet in seconds_per_record
    span_records: int = 0


class StragglerTracker:
    def __init__(self, factor: float, smoothing: float = 0.3) -> None:
        """``factor``: how many times slower than its peers' median makes a worker slow
        (0: never)."""
        if factor < 0:
            raise ValueError(f"straggler factor must be >= 0 (0: off), got {factor}")
        self.factor = factor
        self.smoothing = smoothing
        self._paces: dict[int, _Pace] = {}
        self.ever_slow: set[int] = set()

    @property
    def enabled(self) -> bool:
        return self.factor > 0

    @property
    def known_workers(self) -> int:
        """Workers that have worked and were not forgotten (died, hung, released)."""
        return len(self._paces)

    def started(self, worker: int, now: float) -> None:
        """``worker`` got a task while it held none: it is busy from now."""
        self._paces.setdefault(worker, _Pace()).since = now

    def known(self, worker: int) -> None:
        """``worker`` works (counted in ``known_workers``), its pace untouched."""
        if worker not in self._paces:
            self._paces[worker] = _Pace()

    def reported(self, worker: int, records: int, now: float, measured: bool = True) -> None:
        """An accepted report of ``worker``; ``measured``: of a task whose records count for
        its pace (training, prediction), over ``records`` records."""
        pace = self._paces.setdefault(worker, _Pace(since=now))
        if measured and records > 0 and now > pace.since:
            if pace.tasks:  # the first one was the warm-up
                pace.span_seconds += now - pace.since
                pace.span_records += records
            if pace.span_seconds >= PACE_MIN_SECONDS:
                sample = pace.span_seconds / pace.span_records
                old = pace.seconds_per_record
                pace.seconds_per_record = (
                    sample if old is None else old + self.smoothing * (sample - old)
                )
                pace.span_seconds, pace.span_records = 0.0, 0
            pace.tasks += 1
        pace.since = now

    def forget(self, worker: int) -> None:
        self._paces.pop(worker, None)

    def pace(self, worker: int, now: float, running_records: int = 0) -> float | None:
        """Seconds per record of ``worker``; with ``running_records`` (the records of the task
        it runs), at least what that task has taken so far once that is ``PACE_MIN_SECONDS``
        or more. None: not known yet."""
        pace = self._paces.get(worker)
        if pace is None or not pace.tasks:
            return None
        elapsed = now - pace.since
        stalled = running_records > 0 and elapsed >= PACE_MIN_SECONDS
        bound = elapsed / running_records if stalled else None
        if pace.seconds_per_record is None:
            return bound
        return max(pace.seconds_per_record, bound or 0.0)

    def paces(self, now: float, running: dict[int, int]) -> dict[int, float]:
        """The pace of every worker that has one; ``running``: worker -> records of the task
        it runs (its oldest)."""
        out = {}
        for worker in self._paces:
            value = self.pace(worker, now, running.get(worker, 0))
            if value is not None and value > 0:
                out[worker] = value
        return out

    def slow(self, now: float, running: dict[int, int]) -> dict[int, float]:
        """Slow workers -> how many times their peers' median pace theirs is."""
        if not self.enabled:
            return {}
        paces = self.paces(now, running)
        out = {}
        for worker, value in paces.items():
            peers = [v for w, v in paces.items() if w != worker]
            if not peers:
                continue
            ratio = value / statistics.median(peers)
            if ratio >= self.factor:
                out[worker] = ratio
                self.ever_slow.add(worker)
        return out

    def share_allows(
        self,
        worker: int,
        now: float,
        running: dict[int, int],
        held: int,
        queued_records: int,
        task_records: int,
    ) -> bool:
        """Whether slow ``worker``, holding ``held`` tasks, may take one more of
        ``task_records`` records when ``queued_records`` records are queued."""
        paces = self.paces(now, running)
        mine = paces.get(worker)
        if mine is None:
            return True
        speeds = {w: 1.0 / v for w, v in paces.items()}
        share = queued_records * speeds[worker] / sum(speeds.values())
        return share >= (held + 1) * task_records
