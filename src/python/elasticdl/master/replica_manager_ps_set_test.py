"""The replica manager's part of changing the PS count (master.ps_rescale): the old PS set is
stopped (not relaunched), the change journaled, the new set launched; a restarted master
knows the new count."""

import threading
import time

from elasticdl.master.journal import MemorySink
from elasticdl.master.journal_ops import PSSetChanged
from elasticdl.master.replica_manager import ReplicaManager, ReplicaManagerConfig
from elasticdl.master.replica_manager_test import (
    PS,
    SAFETY_NET_S,
    FakePlatform,
    SlowPSPlatform,
    W,
    _journaled_manager,
    _spec,
)
from elasticdl.master.task_manager import TaskManager, TaskManagerConfig
from elasticdl.platform.base import REASON_DELETED_BY_MASTER, ReplicaEvent, ReplicaPhase


def _ps_phases(rm) -> dict[int, ReplicaPhase]:
    return {s.replica_id: s.phase for s in rm.replicas() if s.replica_type == PS}


def _manager(platform, num_ps):
    tm = TaskManager(TaskManagerConfig(records_per_task=10), training_shards=[("d", 0, 100)])
    rm = ReplicaManager(platform, ReplicaManagerConfig(num_ps, 2), _spec(W), _spec(PS), tm)
    rm.start()
    return rm


def test_scaling_up_stops_the_old_set_then_launches_the_new_one():
    p = FakePlatform()
    rm = _manager(p, num_ps=2)
    launched_before = len(p.launched)
    rm.replace_ps_set(3, PSSetChanged(1, 3, 40))
    assert rm.wait_relaunches(SAFETY_NET_S)
    assert p.deleted == [(PS, 0), (PS, 1)]
    new = [(s.replica_type, s.replica_id) for s in p.launched[launched_before:]]
    assert new == [(PS, 0), (PS, 1), (PS, 2)]  # once each: the old ones' ends relaunched none
    assert rm.config.num_ps == 3
    assert _ps_phases(rm) == {i: ReplicaPhase.RUNNING for i in range(3)}
    assert all(s.relaunch_count == 0 for s in rm.replicas() if s.replica_type == PS)
    # The new set is kept alive by the usual rule.
    p.end(PS, 2, ReplicaPhase.FAILED, 1, "Error")
    assert rm.wait_relaunches(SAFETY_NET_S)
    assert [s.replica_id for s in p.launched if s.replica_type == PS][-1] == 2
    assert rm.failed_message == ""


def test_scaling_down_retires_the_ps_beyond_the_new_count():
    p = FakePlatform()
    rm = _manager(p, num_ps=2)
    rm.replace_ps_set(1, PSSetChanged(1, 1, 40))
    assert rm.wait_relaunches(SAFETY_NET_S)
    assert p.ids(PS) == [0, 1, 0]
    assert _ps_phases(rm) == {0: ReplicaPhase.RUNNING, 1: ReplicaPhase.DELETED}
    p.end(PS, 1, ReplicaPhase.FAILED, 1, "Error")  # a late report of the retired PS
    assert rm.wait_relaunches(SAFETY_NET_S) and p.ids(PS) == [0, 1, 0]


class RetiringPlatform(FakePlatform):
    """Records which replica ids the job gave up (their Services on Kubernetes)."""

    def __init__(self):
        super().__init__()
        self.retired: list[tuple] = []

    def retire(self, replica_type, replica_id):
        self.retired.append((replica_type, replica_id))


def test_only_the_ids_a_smaller_set_gives_up_are_retired_before_it_launches():
    p = RetiringPlatform()
    rm = _manager(p, num_ps=1)
    rm.replace_ps_set(3, PSSetChanged(1, 3, 40))
    assert rm.wait_relaunches(SAFETY_NET_S)
    assert p.retired == []  # scaling up: every old id is in the new set
    rm.replace_ps_set(1, PSSetChanged(2, 1, 80))
    assert rm.wait_relaunches(SAFETY_NET_S)
    assert p.retired == [(PS, 1), (PS, 2)]
    assert p.ids(PS)[-1] == 0


def test_a_restarted_master_keeps_the_changed_ps_count():
    first = SlowPSPlatform()
    first.release.set()
    rm, _, sink = _journaled_manager(first)
    rm.start()
    rm.replace_ps_set(2, PSSetChanged(1, 2, 40))
    rm.replace_ps_set(1, PSSetChanged(2, 1, 80))
    records = list(sink.records)

    second = SlowPSPlatform()
    second.release.set()
    rm, _, _ = _journaled_manager(second)
    rm.restore(records)
    assert rm.config.num_ps == 1 and rm.ps_set == PSSetChanged(2, 1, 80)
    rm.adopt()
    assert rm.wait_relaunches(SAFETY_NET_S)
    # PS 0 of the newest set is adopted; PS 1, retired, is neither adopted nor relaunched.
    assert (PS, 0) in second.adopted and (PS, 1) not in second.adopted
    assert second.ids(PS) == []


# ---- a master that dies during a change ------------------------------------------------------


def _journal_of_a_change(p, to_ps, from_ps=1, **kw):
    """The replica journal of a job of ``from_ps`` PS whose PS 0 failed once, then changed to
    ``to_ps`` PS."""
    tm = TaskManager(TaskManagerConfig(records_per_task=10), training_shards=[("d", 0, 100)])
    rm = ReplicaManager(p, ReplicaManagerConfig(from_ps, 2, **kw), _spec(W), _spec(PS), tm)
    sink = MemorySink()
    rm.attach_journal(sink)
    rm.start()
    p.end(PS, 0, ReplicaPhase.FAILED, 1, "Error")
    assert rm.wait_relaunches(SAFETY_NET_S)
    rm.replace_ps_set(to_ps, PSSetChanged(1, to_ps, 40))
    return list(sink.records)


def _cut_after(records, count, predicate):
    """The journal as a master killed right after the ``count``-th record matching it left."""
    seen = 0
    for i, r in enumerate(records):
        seen += bool(predicate(r))
        if seen == count:
            return records[: i + 1]
    raise AssertionError(f"no {count} matching records in {records}")


def _is_ps_set(r):
    return r["o"] == "ps_set"


def _restarted(records, platform=None, **kw):
    p = platform or SlowPSPlatform()
    p.release.set()
    tm = TaskManager(TaskManagerConfig(records_per_task=10), training_shards=[("d", 0, 100)])
    rm = ReplicaManager(p, ReplicaManagerConfig(1, 2, **kw), _spec(W), _spec(PS), tm)
    rm.restore(records)
    rm.adopt()
    assert rm.wait_relaunches(SAFETY_NET_S)
    return rm, p


def _ps_lives(rm) -> dict[int, tuple[ReplicaPhase, int]]:
    return {
        s.replica_id: (s.phase, s.relaunch_count) for s in rm.replicas() if s.replica_type == PS
    }


def test_a_master_killed_after_the_change_was_journaled_launches_the_whole_new_set():
    records = _cut_after(_journal_of_a_change(FakePlatform(), 2), 1, _is_ps_set)
    rm, p = _restarted(records, max_ps_relaunches=1)
    assert rm.config.num_ps == 2 and rm.ps_set == PSSetChanged(1, 2, 40)
    # New lives, launched (not relaunched: no restart counted against the old PS 0's).
    assert p.ids(PS) == [0, 1] and p.adopted == [(W, 0), (W, 1)]
    assert _ps_lives(rm) == {0: (ReplicaPhase.RUNNING, 0), 1: (ReplicaPhase.RUNNING, 0)}
    # The new PS 0 has its own failure budget, not what is left of the old PS 0's.
    p.end(PS, 0, ReplicaPhase.FAILED, 1, "Error")
    assert rm.wait_relaunches(SAFETY_NET_S)
    assert rm.failed_message == "" and p.ids(PS) == [0, 1, 0]


def test_a_master_killed_while_launching_the_new_set_launches_only_what_it_did_not():
    journal = _journal_of_a_change(FakePlatform(), 3, from_ps=2)
    change = journal.index(next(r for r in journal if _is_ps_set(r)))
    # New PS 0 launched and journaled, PS 1 launching (maybe started, not journaled), PS 2 not.
    records = journal[: change + 4]
    assert [(r["o"], r.get("i")) for r in records[change + 1 :]] == [
        ("launching", 0),
        ("launch", 0),
        ("launching", 1),
    ]
    rm, p = _restarted(records)
    assert (PS, 0) in p.adopted and p.reclaimed == [(PS, 1)]
    assert p.ids(PS) == [1, 2]
    assert _ps_lives(rm) == {i: (ReplicaPhase.RUNNING, 0) for i in range(3)}


def test_a_master_killed_before_retiring_the_ids_a_smaller_set_gave_up_retires_them():
    records = _cut_after(_journal_of_a_change(FakePlatform(), 1, from_ps=3), 1, _is_ps_set)
    rm, p = _restarted(records, platform=_RetiringSlowPlatform())
    assert p.retired == [(PS, 1), (PS, 2)]
    assert p.ids(PS) == [0] and rm.config.num_ps == 1


class _RetiringSlowPlatform(SlowPSPlatform):
    def __init__(self):
        super().__init__()
        self.retired: list[tuple] = []

    def retire(self, replica_type, replica_id):
        self.retired.append((replica_type, replica_id))


def test_a_master_killed_before_the_change_was_journaled_keeps_the_old_set():
    journal = _journal_of_a_change(FakePlatform(), 2)
    # Killed while the old PS were being stopped: their ends journaled, the change not.
    records = journal[: journal.index(next(r for r in journal if _is_ps_set(r)))]
    rm, p = _restarted(records)
    assert rm.ps_set is None and rm.config.num_ps == 1
    # The stopped PS 0 is relaunched as the old set's (it restores the newest complete
    # checkpoint: the snapshot the change wrote).
    assert p.ids(PS) == [0] and _ps_lives(rm) == {0: (ReplicaPhase.RUNNING, 2)}


class _AsyncEndPlatform(FakePlatform):
    """Reports a deleted PS's end from another thread, as a real platform's watcher does."""

    def delete(self, replica_type, replica_id, grace_seconds=10.0):
        self.deleted.append((replica_type, replica_id))
        event = ReplicaEvent(
            replica_type, replica_id, ReplicaPhase.DELETED, 143, REASON_DELETED_BY_MASTER
        )
        threading.Thread(target=self._emit, args=(event,)).start()


class _SlowEndSink(MemorySink):
    """Journaling a replica's end takes a while (a loaded disk)."""

    def record(self, op):
        if op["o"] == "end":
            time.sleep(0.2)
        super().record(op)


def test_the_old_ps_end_is_journaled_before_the_change_and_the_new_ps():
    p = _AsyncEndPlatform()
    tm = TaskManager(TaskManagerConfig(records_per_task=10), training_shards=[("d", 0, 100)])
    rm = ReplicaManager(p, ReplicaManagerConfig(1, 2), _spec(W), _spec(PS), tm)
    sink = _SlowEndSink()
    rm.attach_journal(sink)
    rm.start()
    rm.replace_ps_set(2, PSSetChanged(1, 2, 40))
    assert rm.wait_relaunches(SAFETY_NET_S)
    ops = [(r["o"], r.get("k"), r.get("i")) for r in sink.records if r["o"] != "launching"]
    assert ops[-4:] == [
        ("end", PS, 0),
        ("ps_set", None, None),
        ("launch", PS, 0),
        ("launch", PS, 1),
    ], sink.records
    # So a restarted master adopts the new PS 0 instead of taking it for ended.
    rm, second = _restarted(list(sink.records))
    assert (PS, 0) in second.adopted and second.ids(PS) == []
