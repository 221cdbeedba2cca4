"""The job's current training speed and the time left at that speed (the status's ETA).

Speed is measured over a recent window (:data:`WINDOW_SECONDS` of the master's clock), not
over the job's whole life: when workers are preempted, wait Pending or join, the records/s
and so the ETA follow within one window, where the job's average would lag for as long as
the job has run. No progress over the whole window (every worker gone or Pending) is no
speed and no ETA, rather than an ETA from before.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable

WINDOW_SECONDS = 30.0
# Less than this much of a window measured says nothing yet (a job that just started).
MIN_SPAN_SECONDS = 5.0


class Throughput:
    def __init__(
        self,
        window_s: float = WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        min_span_s: float = MIN_SPAN_SECONDS,
    ) -> None:
        self._window = window_s
        self._min_span = min_span_s
        self._clock = clock
        self._samples: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()

    def observe(self, records_trained: int) -> None:
        """The job's records trained so far (a count that only grows), as of now."""
        now = self._clock()
        with self._lock:
            self._samples.append((now, int(records_trained)))
            # Keep the newest sample at or before the window's start: the window is spanned.
            while len(self._samples) > 2 and self._samples[1][0] <= now - self._window:
                self._samples.popleft()

    def records_per_second(self) -> float | None:
        """Records/s over the window; None until enough of it was measured."""
        with self._lock:
            if len(self._samples) < 2:
                return None
            (t0, r0), (t1, r1) = self._samples[0], self._samples[-1]
        span = t1 - t0
        if span < self._min_span:
            return None
        return max(0, r1 - r0) / span

    def eta_seconds(self, records_left: int) -> float | None:
        """Seconds until ``records_left`` more are trained at the current speed: 0 when none
        are left, None when there is no current speed."""
        if records_left <= 0:
            return 0.0
        rate = self.records_per_second()
        if not rate:
            return None
        return records_left / rate
