"""RecordIO files, byte-compatible with the Go RecordIO library ElasticDL's datasets use.

A file is a sequence of chunks. Every chunk is a 20-byte little-endian header

    magic u32 (0x01020304) | crc32 u32 | compressor u32 | size u32 | num_records u32

followed by ``size`` bytes of payload. The checksum is CRC-32 (IEEE) of the payload *as
stored*; the compressor is 0 (none), 1 (snappy, framing format) or 2 (gzip). Uncompressed,
the payload is the chunk's records, each a ``u32`` length followed by the bytes.

The headers alone tell how many records each chunk holds, so :class:`Index` counts records and
finds the chunk of record ``k`` without reading payloads; this is what makes cutting a file into
tasks cheap for the master. :class:`Scanner` then decompresses only the chunks a task touches.

Writing follows the Go writer's chunking rule (a chunk is cut before a record that would push
the uncompressed record bytes past ``max_chunk_size``; the default is 32 MiB) and its default
compressor (snappy), so files written here and by Go read the same way.
"""
from __future__ import annotations

import bisect
import enum
import gzip
import logging
import os
import struct
import tempfile
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Iterator, List, Optional, Sequence, Union

import cramjam

logger = logging.getLogger(__name__)

MAGIC = 0x01020304
HEADER = struct.Struct("<5I")
HEADER_SIZE = HEADER.size  # 20
DEFAULT_MAX_CHUNK_SIZE = 32 * 1024 * 1024
_U32 = struct.Struct("<I")
_MAX_U32 = 0xFFFFFFFF

PathLike = Union[str, "os.PathLike[str]"]


class RecordIOError(ValueError):
    """A RecordIO file is corrupt, truncated, or used wrongly. The message is one line."""


class Compressor(enum.IntEnum):
    NONE = 0
    SNAPPY = 1
    GZIP = 2

    @classmethod
    def parse(cls, value: Union[int, str, "Compressor", None]) -> "Compressor":
        """Accept an enum member, its number, or its name (any case); None means no compression."""
        if value is None:
            return cls.NONE
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                pass
        else:
            try:
                return cls(int(value))
            except ValueError:
                pass
        choices = ", ".join(f"{c.name.lower()} ({c.value})" for c in cls)
        raise RecordIOError(f"compressor: unknown value {value!r}; choose one of {choices}")


# Limits that keep a corrupt or hostile file from costing more than its size warrants.
# Every record takes at least its 4-byte length in the uncompressed payload, so a chunk
# claims at most (uncompressed bytes) / 4 records; a chunk decompresses to at most
# max(MIN_PAYLOAD_LIMIT, MAX_COMPRESSION_RATIO * stored bytes). The writer's chunks hold at
# most 32 MiB of records (plus one larger record), which real data never compresses 64-fold
# beyond; gzip can (up to 1032:1), so a "gzip bomb" is stopped at this bound, not read in full.
MIN_PAYLOAD_LIMIT = 128 * 1024 * 1024
MAX_COMPRESSION_RATIO = 64


def payload_limit(stored_size: int, compressor: int) -> int:
    """The most bytes a chunk of ``stored_size`` payload bytes may decompress to."""
    if compressor == Compressor.NONE:
        return stored_size
    return max(MIN_PAYLOAD_LIMIT, MAX_COMPRESSION_RATIO * stored_size)


def _compress(payload: bytes, compressor: Compressor) -> bytes:
    if compressor is Compressor.NONE:
        return payload
    if compressor is Compressor.SNAPPY:
        # cramjam.snappy.compress writes the snappy *framing* format, as Go's snappy.NewWriter.
        return bytes(cramjam.snappy.compress(payload))
    # mtime=0 keeps output deterministic: the same records always give the same file.
    return gzip.compress(payload, compresslevel=6, mtime=0)


class PayloadTooLarge(ValueError):
    pass


def _gunzip(stored: bytes, limit: int) -> bytes:
    """gzip members (concatenated, as Go's reader reads them), stopping past ``limit`` bytes."""
    out: List[bytes] = []
    total = 0
    data = stored
    while data:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        buf = data
        while True:
            piece = d.decompress(buf, limit - total + 1)
            total += len(piece)
            out.append(piece)
            if total > limit:
                raise PayloadTooLarge(f"it decompresses to more than {limit} bytes")
            if d.eof:
                data = d.unused_data
                break
            if not d.unconsumed_tail:
                raise EOFError("compressed data ended before the end-of-stream marker")
            buf = d.unconsumed_tail
    return b"".join(out)


def _decompress(stored: bytes, compressor: int, limit: Optional[int] = None) -> bytes:
    """The payload of a chunk; ``PayloadTooLarge`` if it would exceed ``limit`` bytes
    (default :func:`payload_limit`)."""
    if limit is None:
        limit = payload_limit(len(stored), compressor)
    if compressor == Compressor.NONE:
        return stored
    if compressor == Compressor.SNAPPY:
        # The framing format caps each frame at 64 KiB of output, so snappy cannot expand
        # more than ~22-fold: checking afterwards is enough.
        payload = bytes(cramjam.snappy.decompress(stored))
        if len(payload) > limit:
            raise PayloadTooLarge(f"it decompresses to {len(payload)} bytes, over {limit}")
        return payload
    if compressor == Compressor.GZIP:
        return _gunzip(stored, limit)
    raise ValueError(f"unknown compressor id {compressor}")


@dataclass(frozen=True)
class ChunkInfo:
    """Where a chunk lies in its file and what its header says."""

    offset: int  # file offset of the chunk header
    checksum: int
    compressor: int
    size: int  # stored payload bytes
    num_records: int
    first_record: int  # global index of the chunk's first record


class Index:
    """Record count and chunk layout of one RecordIO file, built from the chunk headers only."""

    def __init__(self, path: PathLike):
        self.path = os.fspath(path)
        try:
            with open(self.path, "rb") as f:
                self._chunks = _read_headers(f, self.path)
        except OSError as e:
            raise RecordIOError(f"{self.path}: cannot read RecordIO file: {e.strerror or e}") from e
        self._total = sum(c.num_records for c in self._chunks)
        self._starts = [c.first_record for c in self._chunks]

    def num_records(self) -> int:
        return self._total

    def num_chunks(self) -> int:
        return len(self._chunks)

    @property
    def chunks(self) -> Sequence[ChunkInfo]:
        return tuple(self._chunks)

    def chunk(self, i: int) -> ChunkInfo:
        return self._chunks[i]

    def locate(self, record: int) -> tuple[int, int]:
        """(chunk index, position inside that chunk) of global record ``record``."""
        if not 0 <= record < self._total:
            raise IndexError(f"record {record} out of range [0, {self._total}) in {self.path}")
        c = bisect.bisect_right(self._starts, record) - 1
        # Chunks with zero records share a start with their successor; bisect_right picks the
        # last of them, which is the one that really holds the record.
        return c, record - self._starts[c]


def _read_headers(f: BinaryIO, path: str) -> List[ChunkInfo]:
    f.seek(0, os.SEEK_END)
    file_size = f.tell()
    chunks: List[ChunkInfo] = []
    offset = 0
    first = 0
    while offset < file_size:
        f.seek(offset)
        raw = f.read(HEADER_SIZE)
        i = len(chunks)
        if len(raw) < HEADER_SIZE:
            raise RecordIOError(
                f"{path}: chunk {i} at offset {offset}: truncated header "
                f"({len(raw)} of {HEADER_SIZE} bytes); the file was cut short"
            )
        magic, checksum, compressor, size, num = HEADER.unpack(raw)
        if magic != MAGIC:
            raise RecordIOError(
                f"{path}: chunk {i} at offset {offset}: bad magic 0x{magic:08x} "
                f"(expected 0x{MAGIC:08x}); not a RecordIO file or corrupt"
            )
        if compressor not in (0, 1, 2):
            raise RecordIOError(
                f"{path}: chunk {i} at offset {offset}: unknown compressor {compressor}"
            )
        end = offset + HEADER_SIZE + size
        if end > file_size:
            raise RecordIOError(
                f"{path}: chunk {i} at offset {offset}: truncated payload "
                f"({file_size - offset - HEADER_SIZE} of {size} bytes); the file was cut short"
            )
        if num > payload_limit(size, compressor) // 4:
            # Each record needs at least its 4-byte length: a header claiming more records
            # than its payload can hold is corrupt (and would have tasks cut for records
            # that do not exist).
            raise RecordIOError(
                f"{path}: chunk {i} at offset {offset}: header claims {num} records but its "
                f"{size}-byte payload can hold at most {payload_limit(size, compressor) // 4}; "
                "the file is corrupt"
            )
        chunks.append(ChunkInfo(offset, checksum, compressor, size, num, first))
        first += num
        offset = end
    return chunks


def is_recordio_file(path: PathLike) -> bool:
    """True if ``path`` starts with a RecordIO chunk header (cheap sniff; empty files: False)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return len(head) == 4 and _U32.unpack(head)[0] == MAGIC


def _split_records(payload: bytes, expected: int, where: str) -> List[bytes]:
    """Cut an uncompressed chunk payload into its records, checking the framing."""
    records: List[bytes] = []
    append = records.append
    unpack = _U32.unpack_from
    pos = 0
    n = len(payload)
    # One tight loop with local bindings: per-record cost is a struct read and one slice.
    while pos < n:
        if pos + 4 > n:
            raise RecordIOError(f"{where}: record {len(records)} has a truncated length field")
        (length,) = unpack(payload, pos)
        pos += 4
        end = pos + length
        if end > n:
            raise RecordIOError(
                f"{where}: record {len(records)} claims {length} bytes but only {n - pos} remain"
            )
        append(payload[pos:end])
        pos = end
    if len(records) != expected:
        raise RecordIOError(
            f"{where}: payload holds {len(records)} records but the header says {expected}"
        )
    return records


def read_chunk(f: BinaryIO, chunk: ChunkInfo, index: int, path: str) -> List[bytes]:
    """Read, verify and decode one chunk into its list of records."""
    where = f"{path}: chunk {index} at offset {chunk.offset}"
    f.seek(chunk.offset + HEADER_SIZE)
    stored = f.read(chunk.size)
    if len(stored) != chunk.size:
        raise RecordIOError(f"{where}: truncated payload ({len(stored)} of {chunk.size} bytes)")
    crc = zlib.crc32(stored)
    if crc != chunk.checksum:
        raise RecordIOError(
            f"{where}: checksum mismatch (header 0x{chunk.checksum:08x}, data 0x{crc:08x}); "
            "the file is corrupt"
        )
    try:
        payload = _decompress(stored, chunk.compressor)
    except PayloadTooLarge as e:
        raise RecordIOError(
            f"{where}: {Compressor(chunk.compressor).name.lower()} payload of {chunk.size} bytes "
            f"not read: {e} (a chunk may expand at most {MAX_COMPRESSION_RATIO}-fold beyond "
            f"{MIN_PAYLOAD_LIMIT >> 20} MiB); the file is corrupt or hostile"
        ) from None
    except Exception as e:  # noqa: BLE001 - codec errors come in many types
        raise RecordIOError(
            f"{where}: cannot decompress {Compressor(chunk.compressor).name.lower()} payload: {e}"
        ) from e
    return _split_records(payload, chunk.num_records, where)


class Scanner:
    """Reads records ``[start, start + length)`` of a file (``length < 0``: to the end).

    ``record()`` returns the next record's bytes, or ``None`` once the range is exhausted; the
    scanner is also an iterator. Only the chunks that overlap the range are read, and each is
    verified against its checksum before any of its records is returned.
    """

    def __init__(
        self,
        path: PathLike,
        start: int = 0,
        length: int = -1,
        index: Optional[Index] = None,
    ):
        self.path = os.fspath(path)
        if start < 0:
            raise RecordIOError(f"start must be >= 0, got {start} (file {self.path})")
        self._index = index if index is not None else Index(self.path)
        total = self._index.num_records()
        stop = total if length < 0 else min(total, start + length)
        self._next = start
        self._stop = max(start, stop)
        self._file: Optional[BinaryIO] = None
        self._chunk_idx = -1
        self._records: List[bytes] = []
        self._pos = 0  # position within self._records
        if self._next < self._stop:
            try:
                self._file = open(self.path, "rb")
            except OSError as e:
                raise RecordIOError(f"{self.path}: cannot open: {e.strerror or e}") from e
            self._chunk_idx, self._pos = self._index.locate(self._next)
            self._load(self._chunk_idx)

    def _load(self, chunk_idx: int) -> None:
        assert self._file is not None
        self._records = read_chunk(self._file, self._index.chunk(chunk_idx), chunk_idx, self.path)

    def record(self) -> Optional[bytes]:
        if self._next >= self._stop:
            self.close()
            return None
        while self._pos >= len(self._records):  # skips empty chunks too
            self._chunk_idx += 1
            self._load(self._chunk_idx)
            self._pos = 0
        rec = self._records[self._pos]
        self._pos += 1
        self._next += 1
        return rec

    def records(self, max_count: int = -1) -> List[bytes]:
        """Up to ``max_count`` (all remaining if < 0) records at once, sliced per chunk."""
        out: List[bytes] = []
        want = self._stop - self._next if max_count < 0 else min(max_count, self._stop - self._next)
        while want > 0:
            while self._pos >= len(self._records):
                self._chunk_idx += 1
                self._load(self._chunk_idx)
                self._pos = 0
            take = min(want, len(self._records) - self._pos)
            out.extend(self._records[self._pos : self._pos + take])
            self._pos += take
            self._next += take
            want -= take
        if self._next >= self._stop:
            self.close()
        return out

    def __iter__(self) -> Iterator[bytes]:
        while True:
            batch = self.records(4096)
            if not batch:
                return
            yield from batch

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._records = []

    def __enter__(self) -> "Scanner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_file", None) is not None:
            self._file.close()


def _umask() -> int:
    mask = os.umask(0o022)  # reading it means setting it: put it back at once
    os.umask(mask)
    return mask


class Writer:
    """Writes records into a new RecordIO file, atomically.

    Records go to a temporary file beside ``path``; ``close()`` flushes the last chunk, fsyncs
    and renames it into place, so readers never see a half-written file. Leaving a ``with``
    block by an exception (or calling ``abort()``) deletes the temporary file instead.
    """

    def __init__(
        self,
        path: PathLike,
        compressor: Union[int, str, Compressor, None] = Compressor.SNAPPY,
        max_chunk_size: int = DEFAULT_MAX_CHUNK_SIZE,
    ):
        self.path = os.fspath(path)
        self.compressor = Compressor.parse(compressor)
        if max_chunk_size <= 0:
            raise RecordIOError(f"max_chunk_size must be positive, got {max_chunk_size}")
        self.max_chunk_size = max_chunk_size
        directory = os.path.dirname(os.path.abspath(self.path))
        try:
            fd, self._tmp_path = tempfile.mkstemp(
                prefix=f".{os.path.basename(self.path)}.", suffix=".tmp", dir=directory
            )
        except OSError as e:
            raise RecordIOError(f"{self.path}: cannot create file: {e.strerror or e}") from e
        # mkstemp makes it 0600; data files get the mode any file of the user gets (the umask),
        # so that e.g. the non-root user of a job's pods can read a hostPath data directory.
        os.fchmod(fd, 0o666 & ~_umask())
        self._file: Optional[BinaryIO] = os.fdopen(fd, "wb")
        self._parts: List[bytes] = []
        self._chunk_bytes = 0  # record bytes in the open chunk, as Go counts them
        self._chunk_records = 0
        self.num_records = 0

    def write(self, record: bytes) -> None:
        if self._file is None:
            raise RecordIOError(f"{self.path}: write on a closed Writer")
        if not isinstance(record, (bytes, bytearray, memoryview)):
            raise TypeError(f"record must be bytes, got {type(record).__name__}")
        n = len(record)
        if n > _MAX_U32:
            raise RecordIOError(f"{self.path}: record of {n} bytes exceeds the 4 GiB limit")
        # Go's rule: cut the chunk before a record that would take it past the limit.
        if self._chunk_records and self._chunk_bytes + n > self.max_chunk_size:
            self._flush()
        self._parts.append(_U32.pack(n))
        self._parts.append(bytes(record))
        self._chunk_bytes += n
        self._chunk_records += 1
        self.num_records += 1

    def _flush(self) -> None:
        if not self._chunk_records:
            return
        assert self._file is not None
        payload = _compress(b"".join(self._parts), self.compressor)
        if len(payload) > _MAX_U32:
            raise RecordIOError(f"{self.path}: chunk of {len(payload)} bytes exceeds 4 GiB")
        header = HEADER.pack(
            MAGIC, zlib.crc32(payload), int(self.compressor), len(payload), self._chunk_records
        )
        self._file.write(header)
        self._file.write(payload)
        self._parts = []
        self._chunk_bytes = 0
        self._chunk_records = 0

    def close(self) -> None:
        """Flush and publish the file. Idempotent."""
        if self._file is None:
            return
        try:
            self._flush()
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
            os.replace(self._tmp_path, self.path)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Drop everything written so far; ``path`` is left untouched."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self._parts = []
        try:
            os.unlink(self._tmp_path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self):
        # A Writer dropped without close() publishes nothing.
        if getattr(self, "_file", None) is not None:
            logger.warning("RecordIO Writer for %s was never closed; discarding it", self.path)
            self.abort()
