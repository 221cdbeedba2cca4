"""A small real tmpfs for tests that need a disk that fills up (ENOSPC on a real filesystem).

Mounting needs root (CAP_SYS_ADMIN); where that is missing ``TmpfsUnavailable`` carries the
one-line reason, for the test to skip with. The mount point is a directory this module creates
(and removes again), never one that already existed.
"""
from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator


class TmpfsUnavailable(RuntimeError):
    pass


@contextlib.contextmanager
def mounted_tmpfs(parent: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted on a new directory under ``parent``; unmounted and
    removed on exit."""
    if os.geteuid() != 0:
        raise TmpfsUnavailable("mounting a tmpfs needs root; this test runs as a normal user")
    mount_point = Path(tempfile.mkdtemp(prefix="tmpfs-", dir=parent))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        mount_point.rmdir()
        reason = (done.stderr or done.stdout).strip().splitlines()[:1] or ["no output"]
        raise TmpfsUnavailable(f"mount -t tmpfs failed: {reason[0]}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)
        mount_point.rmdir()


def fill(directory: Path, name: str = "filler") -> Path:
    """Write a file in ``directory`` until its filesystem has no space left; returns it."""
    path = directory / name
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    break
                chunk = chunk[: len(chunk) // 2]
    return path
