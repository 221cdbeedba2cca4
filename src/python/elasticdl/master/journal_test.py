import os
import random

import pytest
from elasticdl.master.journal import Journal, JournalError, decode_frames, encode


def _records(n):
    return [
        {"o": "r", "t": i, "w": i % 3, "c": {"records": 128}, "e": "x" * (i % 5)} for i in range(n)
    ]


def test_records_survive_and_come_back_in_order(tmp_path):
    j = Journal(tmp_path, "tasks", fsync_interval_s=0)
    assert not j.exists()
    j.open()
    recs = _records(50)
    for r in recs:
        j.record(r)
    # No close(): what a SIGKILLed master leaves behind is what os.write wrote.
    again = Journal(tmp_path, "tasks")
    assert again.exists()
    assert again.replay() == (None, recs)


def test_torn_tail_at_every_offset_recovers_the_complete_records(tmp_path):
    recs = _records(12)
    frames = [encode(r) for r in recs]
    data = b"".join(frames)
    ends = []
    pos = 0
    for f in frames:
        pos += len(f)
        ends.append(pos)
    for cut in range(len(data) + 1):
        got = list(decode_frames(data[:cut]))
        complete = sum(1 for e in ends if e <= cut)
        assert got == recs[:complete], cut


def test_corrupt_byte_stops_replay_at_the_last_good_record(tmp_path):
    rng = random.Random(7)
    recs = _records(30)
    frames = [encode(r) for r in recs]
    data = b"".join(frames)
    for _ in range(200):
        at = rng.randrange(len(data))
        bad = bytearray(data)
        bad[at] ^= 1 + rng.randrange(255)
        got = list(decode_frames(bytes(bad)))
        # Everything before the damaged frame, nothing after it, never an exception.
        before = 0
        pos = 0
        for f in frames:
            if pos + len(f) <= at:
                before += 1
            pos += len(f)
        assert got == recs[:before]


def test_torn_file_on_disk_then_a_new_master_appends_after_it(tmp_path):
    j = Journal(tmp_path, "tasks", fsync_interval_s=0)
    j.open()
    recs = _records(10)
    for r in recs:
        j.record(r)
    j.close()
    (seg,) = [p for p in tmp_path.iterdir() if p.suffix == ".log"]
    size = seg.stat().st_size
    with open(seg, "r+b") as f:
        f.truncate(size - 3)  # the last record torn by a crash
    j2 = Journal(tmp_path, "tasks", fsync_interval_s=0)
    state, got = j2.replay()
    assert state is None and got == recs[:9]
    j2.open()  # a fresh segment: nothing is written after the torn bytes
    j2.record({"o": "td"})
    j2.close()
    assert Journal(tmp_path, "tasks").replay() == (None, recs[:9] + [{"o": "td"}])


def test_snapshot_compacts_and_replay_starts_from_it(tmp_path):
    j = Journal(tmp_path, "tasks", fsync_interval_s=0.01, compact_every=5)
    j.open()
    for r in _records(5):
        j.record(r)
    assert j.wants_snapshot()
    j.snapshot({"state": 5})
    assert not j.wants_snapshot()
    j.record({"o": "after"})
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["tasks-00000001.snap", "tasks-00000002.log"], names
    assert Journal(tmp_path, "tasks").replay() == ({"state": 5}, [{"o": "after"}])
    j.snapshot({"state": 6})
    j.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["tasks-00000002.snap", "tasks-00000003.log"], names
    assert Journal(tmp_path, "tasks").replay() == ({"state": 6}, [])


def test_crash_before_the_snapshot_is_renamed_keeps_the_old_one(tmp_path):
    j = Journal(tmp_path, "tasks", fsync_interval_s=0)
    j.open()
    j.record({"o": 1})
    j.snapshot({"s": 1})
    j.record({"o": 2})
    j.close()
    # A snapshot torn while being written never got its final name: a .tmp is ignored.
    (tmp_path / "tasks-00000002.snap.tmp").write_bytes(encode({"s": 2})[:7])
    assert Journal(tmp_path, "tasks").replay() == ({"s": 1}, [{"o": 2}])


def test_unreadable_snapshot_is_a_clear_error(tmp_path):
    (tmp_path / "tasks-00000001.snap").write_bytes(b"garbage")
    with pytest.raises(JournalError, match="cannot resume"):
        Journal(tmp_path, "tasks").replay()


def test_journals_of_other_owners_are_separate(tmp_path):
    a, b = Journal(tmp_path, "tasks", fsync_interval_s=0), Journal(tmp_path, "replicas")
    a.open()
    b.open()
    a.record({"a": 1})
    b.record({"b": 1})
    a.close()
    b.close()
    assert Journal(tmp_path, "tasks").replay() == (None, [{"a": 1}])
    assert Journal(tmp_path, "replicas").replay() == (None, [{"b": 1}])
    assert os.stat(tmp_path / "tasks-00000001.log").st_mode & 0o777 == 0o600
