"""The CPU a job holds, in cores, over one window of ``--num_workers=auto``
(elasticdl.master.autoscaler), which keeps a worker only when it pays for its CPU.

Two sources, one per kind of platform:

* :class:`RequestedCPU` (pods): the sum of the pods' CPU requests, master + PS + workers. The
  request is what the cluster reserves for a pod whether it uses it or not (no other pod is
  scheduled on it), so it is what another worker costs; the master knows the requests from the
  job spec, whereas the pods' CPU counters are on other nodes.
* :class:`MeasuredCPU` (replicas on the master's host): the CPU seconds the master and its
  replica processes used over the window, read from ``/proc/<pid>/stat``, divided by the
  window's length. Processes on one host reserve nothing: what they cost is what they use, and
  the OS counts all of it (every thread: TensorFlow's, gRPC's, data reading).

Both answer ``None`` where the cost is unknown (no CPU request given); the autoscaler then
decides on throughput alone and says so.

On pods the master uses what the replicas *used*, as they report it (:class:`ReportedCPU`:
each worker's and PS's own CPU seconds, elasticdl.common.process_cpu), the same measure as on
one host and as the autoscale benchmarks count; the requests are the fallback while a replica
has not reported across the window. Requests overstate a job whose master and PS use a tenth
of what they reserve, and so make another worker look cheaper than it is.
"""
from __future__ import annotations

import collections
import os
import threading
import time
from typing import Callable, Protocol

from elasticdl.common.job_spec.resources import ResourceError, parse_quantity, parse_resource
from elasticdl.common.process_cpu import own_cpu_seconds


class JobCPU(Protocol):
    source: str  # "requests" or "measured": shown with each decision

    def mark(self) -> object:
        """A reading at the start of a window."""

    def cores(self, since: object, workers: int) -> float | None:
        """The cores the job held from ``since`` (a :meth:`mark`) until now, with ``workers``
        workers; None where unknown."""


def requested_cores(resource: str) -> float | None:
    """``"cpu=250m,memory=1Gi"`` -> 0.25; None without a CPU request."""
    try:
        cpu = parse_resource(resource).get("cpu")
        return float(parse_quantity(cpu)) if cpu else None
    except ResourceError:  # the job spec checked it: cannot happen for a resolved spec
        return None


class RequestedCPU:
    source = "requests"

    def __init__(
        self,
        master: float | None,
        ps: float | None,
        worker: float | None,
        num_ps: Callable[[], int],
    ) -> None:
        self._master, self._ps, self._worker, self._num_ps = master, ps, worker, num_ps

    @classmethod
    def of(cls, master: str, ps: str, worker: str, num_ps: Callable[[], int]) -> "RequestedCPU":
        """From the resource request strings of the job spec."""
        return cls(requested_cores(master), requested_cores(ps), requested_cores(worker), num_ps)

    def mark(self) -> object:
        return None

    def cores(self, since: object, workers: int) -> float | None:
        num_ps = self._num_ps()
        if self._worker is None or self._master is None or (num_ps and self._ps is None):
            return None  # a share of an unknown total means nothing
        return self._master + num_ps * (self._ps or 0.0) + workers * self._worker


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process and of the children it reaped; None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count from its end.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime + cutime + cstime) / _TICKS


class MeasuredCPU:
    """``processes()`` names the job's replica processes now: ``{"worker-1": pid, ...}``. A
    process that started within the window counts with all its CPU seconds; one that ended
    within it is no longer counted (the autoscaler decides on windows in which none ends)."""

    source = "measured"

    def __init__(
        self,
        processes: Callable[[], dict[str, int]],
        clock: Callable[[], float] = time.monotonic,
        read: Callable[[int], float | None] = cpu_seconds,
        own: Callable[[], float] = own_cpu_seconds,
    ) -> None:
        self._processes, self._clock, self._read, self._own = processes, clock, read, own

    def _reading(self) -> tuple[float, dict[tuple[str, int], float]]:
        used = {("master", 0): self._own()}
        for name, pid in self._processes().items():
            seconds = self._read(pid)
            if seconds is not None:
                used[(name, pid)] = seconds
        return self._clock(), used

    def mark(self) -> object:
        return self._reading()

    def cores(self, since: object, workers: int) -> float | None:
        start, before = since
        now, after = self._reading()
        if now <= start:
            return None
        used = sum(s - before.get(key, 0.0) for key, s in after.items())
        return used / (now - start)


class CPUReports:
    """Each replica's cumulative CPU seconds as it reported them, with the master's time of
    arrival (worker task reports, PS load reports); the last ``keep_s`` seconds of them (an
    autoscaling window lasts at most a minute), at most one reading per ``spacing_s`` (a
    worker reports every task: many a second on a large job)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        keep_s: float = 300.0,
        spacing_s: float = 0.5,
    ):
        self._clock, self._keep_s, self._spacing_s = clock, keep_s, spacing_s
        self._lock = threading.Lock()
        self._readings: dict[str, collections.deque] = {}

    def update(self, replica: str, cpu_seconds: float) -> None:
        now = self._clock()
        with self._lock:
            readings = self._readings.setdefault(replica, collections.deque())
            # The newest reading replaces the previous newest while that one is less than
            # spacing_s after the reading before it: kept readings are spacing_s apart, and the
            # newest is always the last report.
            if len(readings) > 1 and now - readings[-2][0] < self._spacing_s:
                readings.pop()
            readings.append((now, float(cpu_seconds)))
            while len(readings) > 2 and readings[0][0] < now - self._keep_s:
                readings.popleft()

    def cores(self, since: float) -> dict[str, float]:
        """Replica -> cores it used from ``since`` on: its CPU seconds between the reading at
        or before ``since`` (else its first after) and its newest, over the time between them.
        Only replicas with two such readings at least half the window apart, the newest after
        ``since``: a replica that stopped reporting (ended, released) is not counted."""
        now = self._clock()
        half = (now - since) / 2
        out = {}
        with self._lock:
            for replica, readings in self._readings.items():
                last = readings[-1]
                if last[0] < since:
                    continue
                first = next((r for r in reversed(readings) if r[0] <= since), None)
                if first is None:
                    first = next(r for r in readings if r[0] >= since)
                if last[0] - first[0] >= half and last[0] > first[0]:
                    out[replica] = max(0.0, last[1] - first[1]) / (last[0] - first[0])
        return out


class ReportedCPU:
    """The cores the master (read here) and its pods (their reports, :class:`CPUReports`)
    used; ``fallback`` (the requests) while a worker or a PS has not reported across the
    window."""

    def __init__(
        self,
        reports: CPUReports,
        num_ps: Callable[[], int],
        fallback: JobCPU | None = None,
        clock: Callable[[], float] = time.monotonic,
        own: Callable[[], float] = own_cpu_seconds,
    ) -> None:
        self._reports, self._num_ps, self._fallback = reports, num_ps, fallback
        self._clock, self._own = clock, own
        self.source = "reported"

    def mark(self) -> object:
        return self._clock(), self._own(), self._fallback.mark() if self._fallback else None

    def cores(self, since: object, workers: int) -> float | None:
        start, own_before, fallback_mark = since
        now = self._clock()
        if now <= start:
            return None
        used = self._reports.cores(start)
        counted_workers = sum(1 for r in used if r.startswith("worker-"))
        counted_ps = sum(1 for r in used if r.startswith("ps-"))
        if counted_workers < workers or counted_ps < self._num_ps():
            self.source = self._fallback.source if self._fallback else "reported"
            return self._fallback.cores(fallback_mark, workers) if self._fallback else None
        self.source = "reported"
        return (self._own() - own_before) / (now - start) + sum(used.values())
