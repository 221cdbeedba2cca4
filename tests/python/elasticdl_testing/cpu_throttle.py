"""A real CPU limit on running processes through a CFS quota, as a node under a noisy
neighbour or a pod's CPU limit would have.

* :func:`cpu_throttled`: one process in a cgroup of its own, made under the process's own
  cgroup in the ``cpu`` hierarchy (cgroup v1's ``cpu.cfs_quota_us``, or v2's ``cpu.max`` where
  the ``cpu`` controller is enabled there); the process (all its threads) is moved into it, and
  on exit it is moved back and the cgroup removed: nothing is left that this module did not
  create.
* :func:`own_cgroup_quota`: the quota of the cgroup a process already is in, changed in place
  and put back on exit. For a container that cgroup is the container's own (under the
  kubelet's pods hierarchy): its quota is what the pod's CPU limit set, and a lower one is a
  lower limit for every process of the container. Nothing is created, so nothing is left in
  the cgroup the container's engine removes when the container ends.

Needs root; where the limit cannot be set ``ThrottleUnavailable`` carries the one-line reason,
for the test to skip with.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import time
from pathlib import Path
from typing import Iterator

PERIOD_US = 100_000


class ThrottleUnavailable(RuntimeError):
    pass


def _cpu_hierarchy() -> tuple[Path, bool]:
    """(mount point of the cgroup hierarchy with the cpu controller, is it cgroup v2)."""
    v2 = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, extra = left.split(), right.split()
            if not extra:
                continue
            if extra[0] == "cgroup" and "cpu" in extra[-1].split(","):
                return Path(fields[4]), False
            if extra[0] == "cgroup2":
                v2 = Path(fields[4])
    if v2 is not None:
        return v2, True
    raise ThrottleUnavailable("no cgroup hierarchy with the cpu controller is mounted")


def _cgroup_of(pid: int, v2: bool) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if (v2 and controllers == "") or (not v2 and "cpu" in controllers.split(",")):
                return path.lstrip("/")
    raise ThrottleUnavailable(f"process {pid} is in no cpu cgroup")


@contextlib.contextmanager
def cpu_throttled(pid: int, fraction: float) -> Iterator[Path]:
    """Process ``pid`` gets at most ``fraction`` of one CPU while in the block."""
    mount, v2, quota = _quota_for(fraction, "a process's")
    home = mount / _cgroup_of(pid, v2)
    group = home / f"elasticdl-throttle-{pid}-{secrets.token_hex(3)}"
    try:
        group.mkdir()
    except OSError as e:
        raise ThrottleUnavailable(f"cannot create a cgroup under {home}: {e.strerror}") from None
    try:
        _set_quota(group, v2, quota)
        try:
            (group / "cgroup.procs").write_text(f"{pid}\n")
        except OSError as e:
            raise ThrottleUnavailable(f"cannot limit the CPU in {group}: {e.strerror}") from None
        yield group
    finally:
        _release(group, home)


def _quota_for(fraction: float, whose: str) -> tuple[Path, bool, int]:
    """(the cpu hierarchy's mount, is it cgroup v2, the CFS quota of ``fraction`` of a CPU per
    ``PERIOD_US``); ``ThrottleUnavailable`` where this process cannot set one."""
    if os.geteuid() != 0:
        raise ThrottleUnavailable(f"limiting {whose} CPU needs root; this test runs as a user")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    mount, v2 = _cpu_hierarchy()
    return mount, v2, max(1000, int(PERIOD_US * fraction))


def _set_quota(group: Path, v2: bool, quota: int) -> None:
    try:
        if v2:
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")
        else:
            (group / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
            (group / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    except OSError as e:
        raise ThrottleUnavailable(f"cannot limit the CPU in {group}: {e.strerror}") from None


def _release(group: Path, home: Path) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            procs = (group / "cgroup.procs").read_text().split()
        except OSError:
            procs = []
        for pid in procs:
            with contextlib.suppress(OSError):  # it may have ended meanwhile
                (home / "cgroup.procs").write_text(f"{pid}\n")
        try:
            group.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@contextlib.contextmanager
def own_cgroup_quota(pid: int, fraction: float) -> Iterator[Path]:
    """Every process in the cgroup of ``pid`` gets at most ``fraction`` of one CPU while in the
    block; the cgroup's quota and period are put back on exit (unless the cgroup is gone: its
    processes ended)."""
    mount, v2, quota = _quota_for(fraction, "a cgroup's")
    group = mount / _cgroup_of(pid, v2)
    if group == mount:
        raise ThrottleUnavailable(f"process {pid} is in the root cgroup, which has no quota")
    files = ["cpu.max"] if v2 else ["cpu.cfs_period_us", "cpu.cfs_quota_us"]
    try:
        before = {name: (group / name).read_text() for name in files}
    except OSError as e:
        raise ThrottleUnavailable(f"cannot read the CPU limit of {group}: {e.strerror}") from None
    try:
        _set_quota(group, v2, quota)
        yield group
    finally:
        if group.is_dir():
            for name in files:
                with contextlib.suppress(FileNotFoundError):  # removed meanwhile: it ended
                    (group / name).write_text(before[name])
