"""How loaded one PS is: its CPU use and how much its model lock makes requests queue, what
the master needs to tell whether another worker can still go faster (``--num_workers=auto``,
elasticdl/master/autoscaler.py).

Every update and read of the model holds one lock (``ParameterServer.lock``), so a PS is
saturated when that lock is busy nearly all the time, whatever its CPU use, or when it has no
CPU left. :class:`MeteredLock` is that lock, timing how long the outermost holder of each
acquisition waited for it (queueing) and held it (work); :class:`LoadMeter` turns the totals
and the process's CPU time into the figures of a window, which the PS reports to the master
every few seconds.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from elasticdl.common.cpu_budget import cgroup_cpu_limit


class MeteredLock:
    """A re-entrant lock that totals its outermost holders' waits and hold times."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._local = threading.local()
        self.acquisitions = 0
        self.wait_s = 0.0
        self.held_s = 0.0

    def acquire(self) -> bool:
        depth = getattr(self._local, "depth", 0)
        if depth:
            self._lock.acquire()
            self._local.depth = depth + 1
            return True
        asked = time.perf_counter()
        self._lock.acquire()
        got = time.perf_counter()
        self._local.depth, self._local.since = 1, got
        # Under the lock: the totals need no lock of their own.
        self.acquisitions += 1
        self.wait_s += got - asked
        return True

    def release(self) -> None:
        depth = self._local.depth - 1
        self._local.depth = depth
        if not depth:
            self.held_s += time.perf_counter() - self._local.since
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc) -> None:
        self.release()


@dataclass(frozen=True)
class Load:
    window_s: float
    cpu_fraction: float  # CPU seconds over wall seconds, over the CPUs the PS may use
    lock_busy_fraction: float  # share of the window the model lock was held
    lock_wait_ms: float  # mean wait for the model lock per request
    requests: int  # acquisitions of the model lock in the window


def cpu_allowance() -> float:
    """The CPUs this process may use, fractions included: its affinity, capped by the quota
    of its own cgroup (found through /proc/self/cgroup, so also on a host where the process
    sits in a cgroup below the mount's root; in a container that cgroup is the root)."""
    cpus = float(len(os.sched_getaffinity(0)))
    limit = _own_cgroup_limit()
    if limit is None:
        limit = cgroup_cpu_limit()
    return min(cpus, limit) if limit else cpus


def _own_cgroup_limit() -> float | None:
    try:
        with open("/proc/self/cgroup") as f:
            entries = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    for _, controllers, path in entries:
        if "cpu" in controllers.split(","):
            base = f"/sys/fs/cgroup/cpu{path}"
            quota, period = _read(f"{base}/cpu.cfs_quota_us"), _read(f"{base}/cpu.cfs_period_us")
            break
        if controllers == "":
            fields = (_read(f"/sys/fs/cgroup{path}/cpu.max") or "").split()
            quota, period = (fields + ["", ""])[:2]
            break
    else:
        return None
    try:
        q, p = int(quota), int(period)
    except (TypeError, ValueError):  # "max" or missing: no quota
        return None
    return q / p if q > 0 and p > 0 else None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


class LoadMeter:
    def __init__(self, lock: MeteredLock, cpus: float | None = None) -> None:
        """``cpus``: what the process may use (default: read every window, since a limit
        may change while the PS runs)."""
        self._lock = lock
        self._cpus = cpus
        self._last = self._sample()

    def _sample(self) -> tuple[float, float, int, float, float]:
        lock = self._lock
        return (
            time.perf_counter(),
            time.process_time(),
            lock.acquisitions,
            lock.wait_s,
            lock.held_s,
        )

    def window(self) -> Load:
        """The load since the previous call (or since this meter was made)."""
        now = self._sample()
        (t0, cpu0, n0, wait0, held0), self._last = self._last, now
        wall = max(now[0] - t0, 1e-9)
        requests = now[2] - n0
        return Load(
            window_s=wall,
            cpu_fraction=(now[1] - cpu0) / wall / (self._cpus or cpu_allowance()),
            lock_busy_fraction=min(1.0, (now[4] - held0) / wall),
            lock_wait_ms=1e3 * (now[3] - wait0) / requests if requests else 0.0,
            requests=requests,
        )
