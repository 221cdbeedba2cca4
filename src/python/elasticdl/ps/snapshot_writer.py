"""Checkpoints that do not stop training: a copy-on-write snapshot written by a child process.

``fork()`` hands the child the parent's memory as it is at that instant, copy-on-write. Called
while the PS holds its model lock, it is a consistent snapshot at one model version of
everything the shard holds (dense parameters, non-trainable state, embedding tables, optimizer
slots) for the price of copying the page tables (about 10 ms per GiB resident). The parent
goes back to applying updates at once; the kernel copies a page only when the parent writes to
it while the child still exists. The child encodes the shard straight from those pages
(``checkpoint.shard_pieces``: no message, no sorted copy of a table), writes it to a temporary
file, renames it into place, reports on a pipe and exits; a thread of the parent reaps it and
logs the outcome.

Rules:

* **One write at a time.** A snapshot asked for while the previous write runs is *skipped*
  (counted, logged), not queued: waiting would block training for the rest of that write,
  and queued snapshots would each keep their own copied pages. The next due version after the
  write ends is written, so checkpoints are at most one write's duration late.
* **A write that dies leaves the previous checkpoint whole.** The shard file is renamed into
  place only once complete; a full disk or a killed child leaves the version incomplete (the
  parent removes the child's temporary file and, as ``checkpoint.save_shard`` does, the rest
  of a version that can no longer become complete), so restores keep using the one before.
* **The child follows its PS.** It checks between pieces of at most ``CHUNK_BYTES`` that its
  parent lives; when the PS died it removes its temporary file and exits.
* **Memory.** Pages the PS changes during the write exist twice, plus the ids of each table
  (8 bytes a row) in the child. The child measures its private memory when it is done (the
  whole overhead) and the parent logs it.
* Anonymous *shared* mappings are not copied on write: the tables' blocks are private
  mappings (``embedding_table._block``). Where ``fork`` fails (no memory for the page tables)
  the caller falls back to a copy under the lock (``Checkpointer``).

Restoring from a copy kept in memory by a process that outlives the PS was considered and
left out: on one host the newest checkpoint is in the page cache anyway (a restore reads it
from memory), and on Kubernetes a relaunched PS is a new pod, often on another node, where
nothing of the old one's memory survives.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from elasticdl.common.job_dir import temp_files_of
from elasticdl.ps import checkpoint
from elasticdl.ps.parameters import Parameters

logger = logging.getLogger(__name__)

# The child checks that its parent lives between pieces of at most this many bytes.
CHUNK_BYTES = 64 << 20


class ParentGone(RuntimeError):
    """The PS died while its child wrote a checkpoint."""


@dataclass
class WriteResult:
    version: int
    directory: str
    ok: bool
    path: str = ""
    error: str = ""
    blocked_s: float = 0.0  # the fork, under the model lock
    write_s: float = 0.0  # from the fork to the child's end
    bytes_written: int = 0
    overhead_bytes: int = 0  # the child's private memory when done: pages copied meanwhile


class SnapshotWriter:
    """Writes one PS's checkpoint shard from a forked child; one write at a time."""

    def __init__(
        self,
        ps_id: int,
        num_ps: int,
        keep_checkpoint_max: int = 0,
        on_done: Callable[[WriteResult], None] | None = None,
    ) -> None:
        self.ps_id = ps_id
        self.num_ps = num_ps
        self.keep_checkpoint_max = keep_checkpoint_max
        self._on_done = on_done
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pid: int | None = None
        self._busy = False  # a write runs, or its on_done does
        self.last_started = 0  # the version of the newest write started
        self.last: WriteResult | None = None  # the newest write that ended

    @property
    def busy(self) -> bool:
        return self._pid is not None

    def start(self, params: Parameters, directory: str) -> bool:
        """Snapshot ``params`` and write it under ``directory`` in the background. Call with
        the model lock held. False when the previous write still runs (nothing is done).
        OSError when the child cannot be made."""
        with self._lock:
            if self._pid is not None:
                return False
            read_end, write_end = os.pipe()
            parent = os.getpid()
            started = time.perf_counter()
            try:
                pid = os.fork()
            except OSError:
                os.close(read_end)
                os.close(write_end)
                raise
            if pid == 0:  # the child: never returns
                os.close(read_end)
                _child(params, directory, self, parent, write_end, started)
            blocked = time.perf_counter() - started
            os.close(write_end)
            self._pid = pid
            self._busy = True
            self.last_started = params.version
        threading.Thread(
            target=self._reap,
            args=(pid, read_end, params.version, directory, started, blocked),
            name=f"checkpoint-writer-{pid}",
            daemon=True,
        ).start()
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Until no write runs (nor one that the end of the last one started); False when
        ``timeout`` passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._busy, timeout)

    def _reap(
        self, pid: int, read_end: int, version: int, directory: str, started: float, blocked: float
    ) -> None:
        with os.fdopen(read_end, "rb") as pipe:
            report = pipe.read()
        _, status = os.waitpid(pid, 0)
        result = WriteResult(version, directory, ok=False, blocked_s=blocked)
        result.write_s = time.perf_counter() - started
        try:
            fields = json.loads(report) if report else {}
        except ValueError:
            fields = {}
        code = os.waitstatus_to_exitcode(status)
        if code == 0 and fields.get("ok"):
            result.ok = True
            result.path = fields["path"]
            result.bytes_written = int(fields.get("bytes", 0))
            result.overhead_bytes = int(fields.get("private_bytes", 0))
        else:
            result.error = fields.get("error") or (
                f"the writing process was killed by signal {-code}"
                if code < 0
                else f"the writing process exited with status {code}"
            )
            self._discard(version, directory)
        self.last = result
        with self._lock:
            self._pid = None  # the next write may start, e.g. from on_done
        if self._on_done is not None:
            self._on_done(result)
        with self._idle:
            self._busy = self._pid is not None
            self._idle.notify_all()

    def _discard(self, version: int, directory: str) -> None:
        """What a dead child left: its temporary file, and a version that cannot become
        complete any more."""
        vdir = checkpoint.version_dir(directory, version)
        name = checkpoint.shard_file_name(self.ps_id, self.num_ps)
        for leftover in temp_files_of(vdir, name):
            leftover.unlink(missing_ok=True)
        checkpoint.discard_incomplete(vdir)


def _child(
    params: Parameters,
    directory: str,
    writer: SnapshotWriter,
    parent: int,
    report_fd: int,
    started: float,
) -> None:
    """The forked writer: encode, write, report, exit. Never returns, never raises (an
    exception must not unwind into the PS's code in this process)."""
    code = 1
    report: dict = {"ok": False}
    try:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)  # the PS's handlers belong to its threads
        if os.getppid() != parent:
            raise ParentGone()
        pieces, total = checkpoint.shard_pieces(params)
        path = checkpoint.save_shard_pieces(
            _chunks(pieces, parent),
            params.version,
            directory,
            writer.ps_id,
            writer.num_ps,
            writer.keep_checkpoint_max,
        )
        report = {"ok": True, "path": path, "bytes": total, "private_bytes": _private_bytes()}
        code = 0
    except ParentGone:
        code = 3
    except OSError as e:
        report["error"] = checkpoint.write_failure(writer.ps_id, params.version, directory, e)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which logs it
        report["error"] = f"{type(e).__name__}: {e}"
    finally:
        try:
            os.write(report_fd, json.dumps(report).encode())
        finally:
            os._exit(code)


def _chunks(pieces, parent: int) -> Iterator[memoryview]:
    for piece in pieces:
        view = memoryview(piece).cast("B")
        for start in range(0, max(1, view.nbytes), CHUNK_BYTES):
            if os.getppid() != parent:
                raise ParentGone()
            yield view[start : start + CHUNK_BYTES]


def _private_bytes() -> int:
    """This process's private memory (what it does not share with the PS any more)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    total = 0
    for line in lines:
        key, _, value = line.partition(":")
        if key in ("Private_Clean", "Private_Dirty"):
            total += int(value.split()[0]) * 1024
    return total
