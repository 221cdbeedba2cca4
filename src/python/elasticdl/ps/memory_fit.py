"""Do a job's embedding tables fit in this PS's memory? Checked before training starts.

A PS creates rows lazily, so without a check a table larger than its memory trains until the
kernel kills the PS, possibly hours in. A worker's first push of the model says each table's
vocabulary (the layer's ``input_dim``; 0 when unbounded or unknown, e.g. hashed ids or an older
worker); the PS then compares, for the tables it does not hold yet, its share of the rows
(ids are split by id mod the PS count) times the bytes a row costs here with the memory it may
still use, and refuses the tables with one line naming them, the GiB needed and the fixes.

Bytes per row: the row and the optimizer's slots (dim x 4 each) plus the id map's share, at
most 30 (16-byte slots, at least 8/15 full right after a growth: src/cc/id_map_cpu.h). Plus the
peak of a growth: a table's blocks (row, each slot) grow one at a time by a copy into a block
twice as large, so for a moment one block's live rows exist twice (the measured peaks are in
benchmarks/ps/README.md).

Memory the PS may use: the smallest cgroup limit over its cgroup and their ancestors (v2
``memory.max``, v1 ``memory.limit_in_bytes``; on Kubernetes the container's limit, which
``--ps_resource_limit`` sets) less what the PS holds already, and at most the machine's
``MemAvailable``. Where the job's PS are processes on one machine (the local platform), each
counts on its 1/N of that, and more PS would not help.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Sequence

from elasticdl.ps.errors import PSError

ID_MAP_BYTES_PER_ROW = 30  # 16-byte slots at load >= 8/15
GIB = float(1 << 30)
_UNLIMITED = 1 << 62  # cgroup v1 says "no limit" with a page-rounded LONG_MAX


class TablesDoNotFitError(PSError):
    """The job's tables need more memory than the PS has; the job must not start training."""


@dataclass(frozen=True)
class TableDemand:
    name: str
    vocabulary: int  # rows the layer can address; 0: unknown
    dim: int


@dataclass(frozen=True)
class MemoryRoom:
    bytes: int
    source: str  # where the figure comes from, for the error message
    shared_by: int = 1  # PS of the job that split the machine's memory (local processes)


def split(room: MemoryRoom, num_ps: int) -> MemoryRoom:
    """This PS's part of `room` when the job's `num_ps` PS run on the same machine."""
    if num_ps <= 1:
        return room
    return MemoryRoom(
        room.bytes // num_ps, f"{room.source}, split over the job's {num_ps} PS on it", num_ps
    )


def bytes_per_row(dim: int, num_slots: int) -> int:
    return 4 * dim * (1 + num_slots) + ID_MAP_BYTES_PER_ROW


def rows_per_ps(vocabulary: int, num_ps: int) -> int:
    return -(-vocabulary // num_ps)


def needed_bytes(tables: Sequence[TableDemand], num_ps: int, num_slots: int) -> int:
    """The tables' share on one PS at rest, plus the copy of the largest block while it grows."""
    rest = sum(rows_per_ps(t.vocabulary, num_ps) * bytes_per_row(t.dim, num_slots) for t in tables)
    growth = max((rows_per_ps(t.vocabulary, num_ps) * 4 * t.dim for t in tables), default=0)
    return rest + growth


def check_fit(tables: Sequence[TableDemand], num_ps: int, num_slots: int, room: MemoryRoom) -> None:
    """Raise TablesDoNotFitError when the tables of known vocabulary exceed `room`."""
    known = sorted(
        (t for t in tables if t.vocabulary > 0),
        key=lambda t: -rows_per_ps(t.vocabulary, num_ps) * bytes_per_row(t.dim, num_slots),
    )
    need = needed_bytes(known, num_ps, num_slots)
    if not known or need <= room.bytes:
        return
    described = ", ".join(
        f"{t.name!r} (vocabulary {t.vocabulary:,}, dim {t.dim}: "
        f"{rows_per_ps(t.vocabulary, num_ps):,} rows x {bytes_per_row(t.dim, num_slots)} B "
        "on each PS)"
        for t in known[:3]
    ) + (f" and {len(known) - 3} more" if len(known) > 3 else "")
    machine = room.bytes * room.shared_by  # all of it, on a machine of its own
    fits_ps = num_ps + 1
    if machine > 0:
        fits_ps = max(fits_ps, math.ceil(needed_bytes(known, 1, num_slots) / machine))
    if room.shared_by > 1:  # more PS on the same machine split the same memory
        fixes = (
            f"PS on machines of their own (--num_ps_pods {fits_ps} or more on Kubernetes), "
            "a machine with more memory or a smaller dim"
        )
    else:
        fixes = (
            f"more PS (--num_ps_pods {fits_ps} or more), a larger PS memory limit "
            "(--ps_resource_limit memory=...) or a smaller dim"
        )
    noun, verb = ("table", "needs") if len(known) == 1 else ("tables", "need")
    raise TablesDoNotFitError(
        f"embedding {noun} {described} {verb} {need / GIB:.1f} GiB on each of {num_ps} PS "
        f"(row + {num_slots} optimizer slots + id map, and a block's copy as it grows), more than "
        f"the {room.bytes / GIB:.1f} GiB this PS has ({room.source}): use {fixes}"
    )


# ---------------------------------------------------------------------------------------------
# How much memory this process may still use.


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _kib_field(path: str, key: str) -> int | None:
    text = _read(path)
    for line in (text or "").splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return None


def _ancestors(path: str) -> list[str]:
    """'/a/b' -> ['/a/b', '/a', '/']: a cgroup is bound by its ancestors' limits too."""
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:k]) for k in range(len(parts), -1, -1)]


def cgroup_limit(proc: str = "/proc", cgroup_fs: str = "/sys/fs/cgroup") -> int | None:
    """The smallest memory limit over this process's cgroup and its ancestors, or None."""
    limits = []
    for line in (_read(f"{proc}/self/cgroup") or "").splitlines():
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and controllers == "":
            base, name = cgroup_fs, "memory.max"  # v2
        elif "memory" in controllers.split(","):
            base, name = os.path.join(cgroup_fs, "memory"), "memory.limit_in_bytes"  # v1
        else:
            continue
        # Inside a container's cgroup namespace the path may not exist below the mount, whose
        # root then is the container's own cgroup: the ancestors' walk ends there.
        for cg in _ancestors(path):
            value = _read(os.path.join(base, cg.lstrip("/"), name))
            if value and value != "max" and value.isdigit() and int(value) < _UNLIMITED:
                limits.append(int(value))
    return min(limits) if limits else None


def memory_room(proc: str = "/proc", cgroup_fs: str = "/sys/fs/cgroup") -> MemoryRoom:
    available = _kib_field(f"{proc}/meminfo", "MemAvailable")
    limit = cgroup_limit(proc, cgroup_fs)
    candidates = []
    if limit is not None:
        own = _kib_field(f"{proc}/self/status", "VmRSS") or 0
        candidates.append(
            MemoryRoom(
                max(0, limit - own),
                f"cgroup memory limit {limit / GIB:.1f} GiB less its {own / GIB:.1f} GiB in use",
            )
        )
    if available is not None:
        candidates.append(MemoryRoom(available, "MemAvailable of its machine"))
    if not candidates:
        return MemoryRoom(_UNLIMITED, "no limit found")
    return min(candidates, key=lambda r: r.bytes)
