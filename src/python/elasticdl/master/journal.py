"""An append-only journal of the master's state transitions, so a restarted master resumes the
job where the dead one left it (docs/architecture.md, "When the master dies").

Layout: one journal per state owner (``tasks``, ``evaluation``, ``replicas``) in ``<job
dir>/journal/``::

    tasks-00000003.log    segment 3: records appended since snapshot 2
    tasks-00000002.snap   snapshot: the owner's whole state after every record of segments <= 2

A record is a JSON object (an operation of ``master.journal_ops``) framed as
``<u32 length><u32 CRC32 of the payload><payload>`` (little-endian). Replay reads the newest
valid snapshot, then every later segment up to its first incomplete or corrupt frame: a tail
torn by a crash (or cut anywhere) ends that segment cleanly, never with an exception. A new
master always writes into a fresh segment, so a torn tail is never followed by new records in
the same file.

Durability rule: :meth:`Journal.record` writes the record with one ``os.write`` to the file
before it returns, and the owners call it before the RPC that caused the transition is
answered; the data is then in the kernel's page cache and survives the master process being
SIGKILLed or running out of memory. ``fsync`` is periodic (every ``fsync_interval_s``, on a
background thread) and at every snapshot, so a *machine* crash may lose the last second of
records: out of scope here (a restarted machine has lost the replicas too).

Compaction: when a segment holds ``compact_every`` records the owner hands its whole state to
:meth:`snapshot` (under its own lock, so the state matches the records exactly): writes go to
a new segment, the snapshot is written to a temporary file, fsynced and renamed into place,
and only then are the older segments and snapshots deleted. A crash at any point leaves
either the old snapshot with all its segments or the new one.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import threading
import zlib
from pathlib import Path
from typing import Any, Iterator, Protocol

from elasticdl.common.job_dir import write_atomically

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("<II")
# A frame longer than this is corruption, not a record (snapshots of huge jobs stay below).
MAX_RECORD_BYTES = 1 << 30
_FILE = re.compile(r"(?P<name>[a-z]+)-(?P<seq>\d{8})\.(?P<kind>log|snap)")


class JournalError(RuntimeError):
    """The journal cannot be used to resume (unreadable snapshot, records that do not match
    the job); the message says what to do."""


class JournalSink(Protocol):
    """What a state owner needs from its journal."""

    def record(self, op: dict) -> None:
        """Append ``op``; it is written when this returns."""

    def wants_snapshot(self) -> bool:
        """The current segment is long: the owner should call :meth:`snapshot` now."""

    def snapshot(self, state: dict) -> None:
        """Replace everything recorded so far by ``state``."""


def encode(record: dict) -> bytes:
    payload = json.dumps(record, separators=(",", ":")).encode()
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def decode_frames(data: bytes) -> Iterator[dict]:
    """The records of ``data`` up to its first incomplete or corrupt frame."""
    pos, end = 0, len(data)
    while pos + _HEADER.size <= end:
        length, crc = _HEADER.unpack_from(data, pos)
        start = pos + _HEADER.size
        if length > MAX_RECORD_BYTES or start + length > end:
            return
        payload = data[start : start + length]
        if zlib.crc32(payload) != crc:
            return
        try:
            record = json.loads(payload)
        except ValueError:
            return
        if not isinstance(record, dict):
            return
        yield record
        pos = start + length


class Journal:
    """One owner's journal (see the module docstring). Thread-safe."""

    def __init__(
        self,
        directory: str | os.PathLike,
        name: str,
        *,
        fsync_interval_s: float = 1.0,
        compact_every: int = 100_000,
    ) -> None:
        if not re.fullmatch(r"[a-z]+", name):
            raise ValueError(f"journal name {name!r}: use lowercase letters only")
        self.directory = Path(directory)
        self.name = name
        self.compact_every = compact_every
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._seq = 0
        self._records_in_segment = 0
        self._dirty = False
        self._closed = False
        self._fsync_interval_s = fsync_interval_s
        self._fsync_thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ---- reading -------------------------------------------------------------------------
    def _files(self) -> list[tuple[int, str, Path]]:
        if not self.directory.is_dir():
            return []
        out = []
        for path in self.directory.iterdir():
            m = _FILE.fullmatch(path.name)
            if m and m["name"] == self.name:
                out.append((int(m["seq"]), m["kind"], path))
        return sorted(out)

    def exists(self) -> bool:
        """Whether anything was ever recorded here."""
        return any(path.stat().st_size for _, _, path in self._files())

    def replay(self) -> tuple[dict | None, list[dict]]:
        """``(snapshot state or None, records after it in order)``."""
        files = self._files()
        snaps = [(seq, path) for seq, kind, path in files if kind == "snap"]
        state, base = None, -1
        if snaps:
            base, path = snaps[-1]
            records = list(decode_frames(path.read_bytes()))
            if len(records) != 1:
                raise JournalError(
                    f"journal snapshot {path} is unreadable; the job cannot resume from it "
                    "(remove the job directory's journal/ to start the job over)"
                )
            state = records[0]
        records = []
        for seq, kind, path in files:
            if kind == "log" and seq > base:
                records.extend(decode_frames(path.read_bytes()))
        return state, records

    # ---- writing -------------------------------------------------------------------------
    def open(self) -> None:
        """Start writing into a fresh segment after everything that exists."""
        self.directory.mkdir(parents=True, exist_ok=True)
        files = self._files()
        self._seq = (files[-1][0] if files else 0) + 1
        self._open_segment()
        if self._fsync_interval_s > 0:
            self._fsync_thread = threading.Thread(
                target=self._fsync_loop, name=f"journal-{self.name}-fsync", daemon=True
            )
            self._fsync_thread.start()

    def _segment_path(self, seq: int, kind: str = "log") -> Path:
        return self.directory / f"{self.name}-{seq:08d}.{kind}"

    def _open_segment(self) -> None:
        self._fd = os.open(
            self._segment_path(self._seq),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
            0o600,
        )
        self._records_in_segment = 0

    def record(self, op: dict) -> None:
        data = encode(op)
        with self._lock:
            if self._fd is None:
                raise JournalError(f"journal {self.name} is not open")
            os.write(self._fd, data)
            self._records_in_segment += 1
            self._dirty = True

    def wants_snapshot(self) -> bool:
        return self.compact_every > 0 and self._records_in_segment >= self.compact_every

    def snapshot(self, state: dict[str, Any]) -> None:
        with self._lock:
            if self._fd is None:
                raise JournalError(f"journal {self.name} is not open")
            covered = self._seq
            os.fsync(self._fd)
            os.close(self._fd)
            self._seq += 1
            self._open_segment()
            final = self._segment_path(covered, "snap")
            write_atomically(final, encode(state), mode=0o600, durable=True)
            for seq, _kind, path in self._files():
                if seq <= covered and path != final:
                    path.unlink(missing_ok=True)

    def _fsync_loop(self) -> None:
        while not self._stop.wait(self._fsync_interval_s):
            self.sync()

    def sync(self) -> None:
        with self._lock:
            if self._fd is not None and self._dirty:
                os.fsync(self._fd)
                self._dirty = False

    def close(self) -> None:
        self._stop.set()
        if self._fsync_thread is not None:
            self._fsync_thread.join(timeout=5)
        with self._lock:
            if self._fd is not None:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = None


class MemorySink:
    """A journal sink in memory (replay-equivalence tests, the dispatch benchmark's baseline)."""

    def __init__(self) -> None:
        self.state: dict | None = None
        self.records: list[dict] = []

    def record(self, op: dict) -> None:
        self.records.append(json.loads(json.dumps(op)))  # what a file would give back

    def wants_snapshot(self) -> bool:
        return False

    def snapshot(self, state: dict) -> None:
        self.state = json.loads(json.dumps(state))
        self.records = []
