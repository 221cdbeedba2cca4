import gzip
import hashlib
import os
import shutil
import struct
import tracemalloc
import zlib

import pytest
from elasticdl.data import recordio
from elasticdl.data.recordio import Compressor, Index, RecordIOError, Scanner, Writer

GO_FILE = os.path.join(os.path.dirname(__file__), "testdata", "go_written_777.rio")
GO_COUNT = 777


def go_record(i: int) -> bytes:
    """The rule the Go fixture was written with (see testdata/README.md)."""
    n = 1 + (i * 7919) % 300
    return (hashlib.sha256(str(i).encode()).digest() * (n // 32 + 1))[:n]


def test_go_file_all_records_byte_for_byte():
    assert Index(GO_FILE).num_records() == GO_COUNT
    got = list(Scanner(GO_FILE))
    assert len(got) == GO_COUNT
    for i, rec in enumerate(got):
        assert rec == go_record(i), f"record {i} differs"


def test_go_file_is_snappy_single_chunk():
    idx = Index(GO_FILE)
    assert idx.num_chunks() == 1
    assert idx.chunk(0).compressor == Compressor.SNAPPY


def test_go_file_record_method_and_ranges():
    s = Scanner(GO_FILE, start=100, length=50)
    got = []
    while (r := s.record()) is not None:
        got.append(r)
    assert got == [go_record(i) for i in range(100, 150)]
    assert s.record() is None
    # Range running past the end is clipped; start past the end is empty.
    assert list(Scanner(GO_FILE, start=770, length=100)) == [go_record(i) for i in range(770, 777)]
    assert list(Scanner(GO_FILE, start=777)) == []
    assert list(Scanner(GO_FILE, start=5, length=0)) == []


def _write(path, records, compressor, max_chunk_size=recordio.DEFAULT_MAX_CHUNK_SIZE):
    with Writer(path, compressor=compressor, max_chunk_size=max_chunk_size) as w:
        for r in records:
            w.write(r)
    return path


@pytest.mark.parametrize("compressor", ["none", "snappy", "gzip", 0, Compressor.GZIP])
def test_round_trip_multi_chunk(tmp_path, compressor):
    records = [go_record(i) for i in range(1000)]
    path = _write(tmp_path / "f.rio", records, compressor, max_chunk_size=2000)
    idx = Index(path)
    assert idx.num_records() == 1000
    assert idx.num_chunks() > 50  # ~150 bytes/record, 2000 bytes/chunk
    assert list(Scanner(path)) == records
    # Ranges that start and end in the middle of chunks.
    for start, length in [(0, 1), (7, 13), (133, 400), (999, 5), (500, -1)]:
        want = records[start : start + length] if length >= 0 else records[start:]
        assert list(Scanner(path, start, length, index=idx)) == want
    assert Scanner(path, 13, 100).records(30) == records[13:43]


def test_chunking_rule_matches_go(tmp_path):
    # Go cuts a chunk before a record that would push record bytes past the limit.
    path = _write(tmp_path / "c.rio", [b"a" * 10] * 7, "none", max_chunk_size=30)
    idx = Index(path)
    assert [c.num_records for c in idx.chunks] == [3, 3, 1]
    # A record larger than the limit still gets its own chunk.
    path = _write(tmp_path / "big.rio", [b"x" * 100, b"y"], "none", max_chunk_size=30)
    assert [c.num_records for c in Index(path).chunks] == [1, 1]


def test_snappy_file_layout_like_go(tmp_path):
    """Our snappy file decodes with the same steps as the Go fixture (framed snappy payload)."""
    records = [go_record(i) for i in range(GO_COUNT)]
    path = _write(tmp_path / "ours.rio", records, "snappy")
    data = open(path, "rb").read()
    magic, crc, comp, size, num = struct.unpack_from("<5I", data)
    assert (magic, comp, num, size + 20) == (0x01020304, 1, GO_COUNT, len(data))
    assert data[20:30] == open(GO_FILE, "rb").read()[20:30]  # framing stream identifier
    assert list(Scanner(path)) == records


def test_empty_writer_gives_empty_file(tmp_path):
    path = _write(tmp_path / "e.rio", [], "snappy")
    assert os.path.getsize(path) == 0
    assert Index(path).num_records() == 0
    assert list(Scanner(path)) == []


def test_writer_is_atomic(tmp_path):
    path = tmp_path / "a.rio"
    with pytest.raises(RuntimeError):
        with Writer(path) as w:
            w.write(b"abc")
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []
    w = Writer(path)
    w.write(b"abc")
    assert not path.exists()  # invisible until close
    w.close()
    w.close()  # idempotent
    assert list(Scanner(path)) == [b"abc"]
    with pytest.raises(RecordIOError, match="closed"):
        w.write(b"x")


def test_bad_compressor_message():
    with pytest.raises(RecordIOError, match=r"compressor: unknown value 'lz4'; choose one of"):
        Compressor.parse("lz4")


def test_corrupt_payload_is_detected(tmp_path):
    path = tmp_path / "bad.rio"
    shutil.copy(GO_FILE, path)
    data = bytearray(open(path, "rb").read())
    data[1000] ^= 0xFF
    open(path, "wb").write(bytes(data))
    assert Index(path).num_records() == GO_COUNT  # headers are fine
    with pytest.raises(RecordIOError) as e:
        list(Scanner(path))
    msg = str(e.value)
    assert "\n" not in msg and "bad.rio" in msg and "chunk 0 at offset 0" in msg
    assert "checksum mismatch" in msg


def test_truncated_and_foreign_files(tmp_path):
    records = [go_record(i) for i in range(300)]
    path = _write(tmp_path / "t.rio", records, "gzip", max_chunk_size=5000)
    idx = Index(path)
    second = idx.chunk(1).offset
    data = open(path, "rb").read()
    cut = tmp_path / "cut.rio"
    cut.write_bytes(data[: second + 30])
    with pytest.raises(RecordIOError, match=r"cut.rio: chunk 1 at offset \d+: truncated payload"):
        Index(cut)
    cut.write_bytes(data[: second + 7])
    with pytest.raises(RecordIOError, match=r"chunk 1 at offset \d+: truncated header"):
        Index(cut)
    other = tmp_path / "notes.txt"
    other.write_bytes(b"hello world, this is not recordio")
    with pytest.raises(RecordIOError, match="bad magic"):
        Index(other)
    assert not recordio.is_recordio_file(other) and recordio.is_recordio_file(path)
    with pytest.raises(RecordIOError, match="cannot read"):
        Index(tmp_path / "missing.rio")


def test_header_record_count_mismatch_detected(tmp_path):
    path = _write(tmp_path / "m.rio", [b"a" * 20, b"b"], "none")
    data = bytearray(open(path, "rb").read())
    struct.pack_into("<I", data, 16, 3)  # claim 3 records
    path.write_bytes(bytes(data))
    with pytest.raises(RecordIOError, match="holds 2 records but the header says 3"):
        list(Scanner(path))


def chunk_file(path, payload: bytes, num_records: int, compressor: int) -> str:
    """One chunk with a valid checksum and whatever header the caller wants."""
    header = recordio.HEADER.pack(
        recordio.MAGIC, zlib.crc32(payload), compressor, len(payload), num_records
    )
    path.write_bytes(header + payload)
    return str(path)


class _CountingFile:
    """A file object that records the size of every ``read`` on it."""

    def __init__(self, f, sizes: list):
        self._f, self._sizes = f, sizes

    def read(self, n=-1):
        data = self._f.read(n)
        self._sizes.append(len(data))
        return data

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


def _count_reads(monkeypatch) -> list:
    """Sizes of the reads recordio makes on the files it opens from now on."""
    sizes: list = []
    monkeypatch.setattr(
        recordio, "open", lambda *a, **k: _CountingFile(open(*a, **k), sizes), raising=False
    )
    return sizes


@pytest.mark.parametrize("compressor", [0, 1, 2])
def test_header_claiming_four_billion_records_is_not_indexed(tmp_path, monkeypatch, compressor):
    payload = recordio._compress(struct.pack("<I", 1) + b"x", Compressor(compressor))
    path = chunk_file(tmp_path / "huge.rio", payload, 0xFFFFFFFF, compressor)
    reads = _count_reads(monkeypatch)
    tracemalloc.start()
    try:
        with pytest.raises(RecordIOError, match="claims 4294967295 records but its") as e:
            Index(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "\n" not in str(e.value)
    # Refused from the header alone: its one read, and nothing allocated per claimed record.
    assert reads == [recordio.HEADER_SIZE]
    assert peak < 1 << 20, peak


def test_gzip_bomb_is_not_read_in_full(tmp_path, monkeypatch):
    # 300 gzip members of 1 MiB of zeros: ~300 KiB stored, 300 MiB if read in full.
    member = gzip.compress(bytes(1 << 20), 9)
    bomb = member * 300
    path = chunk_file(tmp_path / "bomb.rio", bomb, 1000, 2)
    index = Index(path)  # the header is plausible: 1000 records
    read = []
    real_gunzip = recordio._gunzip
    monkeypatch.setattr(
        recordio, "_gunzip", lambda stored, limit: read.append(limit) or real_gunzip(stored, limit)
    )
    with pytest.raises(RecordIOError, match="not read: it decompresses to more than") as e:
        with open(path, "rb") as f:
            recordio.read_chunk(f, index.chunk(0), 0, path)
    assert read == [recordio.MIN_PAYLOAD_LIMIT] and "\n" not in str(e.value)


def test_bounded_gunzip_reads_concatenated_members_and_stops_at_the_limit():
    data = gzip.compress(b"a" * 1000) + gzip.compress(b"b" * 1000)
    assert recordio._gunzip(data, 2000) == b"a" * 1000 + b"b" * 1000
    with pytest.raises(recordio.PayloadTooLarge):
        recordio._gunzip(data, 1999)
    with pytest.raises(EOFError):
        recordio._gunzip(data[:-12], 10_000)


def test_payload_limit_is_the_stored_size_scaled():
    assert recordio.payload_limit(100, 0) == 100
    assert recordio.payload_limit(100, 2) == recordio.MIN_PAYLOAD_LIMIT
    big = recordio.MIN_PAYLOAD_LIMIT
    assert recordio.payload_limit(big, 1) == recordio.MAX_COMPRESSION_RATIO * big


def test_a_scan_reads_the_file_a_chunk_at_a_time_not_a_record_at_a_time(tmp_path, monkeypatch):
    """200k small records in 1 MiB chunks: indexing reads each chunk's header once, the scan
    each chunk's payload once; no file access per record. (Its speed is a benchmark:
    benchmarks/data/recordio_scan.py.)"""
    records = [b"%08d" % i * 4 for i in range(200_000)]
    path = _write(tmp_path / "scan.rio", records, "snappy", max_chunk_size=1 << 20)
    chunks = Index(path).chunks
    assert 1 < len(chunks) < 200_000 // 1000
    reads = _count_reads(monkeypatch)
    assert list(Scanner(path)) == records
    assert sorted(reads) == sorted([recordio.HEADER_SIZE] * len(chunks) + [c.size for c in chunks])


def test_written_files_get_the_umasks_mode_not_mkstemps_0600(tmp_path):
    """Data files are as readable as any file of the user (the non-root user of restricted
    Kubernetes pods reads hostPath data), unlike mkstemp's 0600."""
    old = os.umask(0o022)
    try:
        with Writer(tmp_path / "a.rio") as w:
            w.write(b"x")
        os.umask(0o077)
        with Writer(tmp_path / "b.rio") as w:
            w.write(b"x")
    finally:
        os.umask(old)
    assert (tmp_path / "a.rio").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "b.rio").stat().st_mode & 0o777 == 0o600
