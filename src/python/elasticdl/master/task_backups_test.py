"""Stragglers in the task manager: a slow worker's task backed up by an idle one (first report
wins, every record counted once), a slow worker given no more than its share near the end,
the holders of a backed-up task dying or failing, and all of it replayed from the journal."""
from typing import NamedTuple

import pytest
from elasticdl.master.journal import MemorySink
from elasticdl.master.task_backups import BACKUP_MIN_AGE_SECONDS
from elasticdl.master.task_manager import TaskManager, TaskManagerConfig, TaskType
from elasticdl.master.tasks import WAIT_TASK, Task


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def manager(clock, shards=(("f", 0, 40),), factor=3.0, **kw):
    return TaskManager(
        TaskManagerConfig(records_per_task=4, num_epochs=1, straggler_factor=factor, **kw),
        training_shards=list(shards),
        clock=clock,
    )


def journaled(tm):
    sink = MemorySink()
    tm.attach_journal(sink)
    return sink


def replayed(sink, clock, **kw):
    tm = manager(clock, **kw)
    tm.replay(sink.state, sink.records)
    return tm


def run_fast(tm, clock, worker, tasks, seconds=1.0):
    """``worker`` takes and finishes ``tasks`` tasks, ``seconds`` each."""
    for _ in range(tasks):
        task = tm.get(worker)
        assert task.type == TaskType.TRAINING
        clock.now += seconds
        assert tm.report(task.task_id, True, worker)


def warm_up(tm, clock):
    """Both workers' first task (their warm-up, not measured)."""
    run_fast(tm, clock, 0, 1)
    run_fast(tm, clock, 1, 1)


def slow_start(tm, clock):
    """After the warm-up, worker 0 takes a task and stalls on it while worker 1 trains at
    1 s a task (8 of the 10 tasks handed out)."""
    warm_up(tm, clock)
    stuck = tm.get(0)
    run_fast(tm, clock, 1, 5)
    return stuck


class Stalled(NamedTuple):
    clock: Clock
    tm: TaskManager
    sink: MemorySink
    stuck: Task


@pytest.fixture
def stalled():
    """Makes a journaled job (``manager``'s keywords) past :func:`slow_start`, then worker 1
    trains ``more`` tasks: with the default 2 the queue is empty (tasks 1 .. 10 handed out)
    and no copy of worker 0's task is handed out yet."""

    def make(more: int = 2, **kw) -> Stalled:
        clock = Clock()
        tm = manager(clock, **kw)
        sink = journaled(tm)
        stuck = slow_start(tm, clock)
        run_fast(tm, clock, 1, more)
        return Stalled(clock, tm, sink, stuck)

    return make


def test_an_idle_worker_backs_up_a_slow_workers_task_and_the_first_report_wins(stalled):
    clock, tm, sink, stuck = stalled()
    assert tm.straggler_status()["slow_workers"][0]["worker"] == 0
    copy = tm.get(1)
    assert copy.task_id == stuck.task_id and copy.shard == stuck.shard
    assert tm.get(2) == WAIT_TASK  # one copy per task
    clock.now += 1
    assert tm.report(copy.task_id, True, 1)  # the copy first: counted
    assert not tm.report(stuck.task_id, True, 0)  # dropped, as any stale report
    s = tm.summary()
    assert s.finished and s.records_trained == s.records_expected == 40
    assert (s.backups_issued, s.backups_won, s.backup_reports_dropped) == (1, 1, 1)
    assert s.stale_reports == 0  # no task was taken back from worker 0
    assert tm.straggler_status()["ever_slow"] == [0]
    assert replayed(sink, clock).state() == tm.state()


def test_a_task_is_copied_only_once_it_has_run_long_enough():
    """Tasks of a fraction of a second: a copy would cost more than it could win back, so a
    worker measured slow keeps a task younger than the floor to itself."""
    clock = Clock()
    tm = manager(clock, shards=(("f", 0, 400),))
    warm_up(tm, clock)
    measured = tm.get(0)
    run_fast(tm, clock, 1, 25, seconds=0.1)
    assert tm.report(measured.task_id, True, 0)  # 25 times worker 1's pace
    handed_out = clock.now
    stuck = tm.get(0)  # 72 tasks queued: its share is 2.8 of them
    assert stuck.type == TaskType.TRAINING
    run_fast(tm, clock, 1, 71, seconds=0.01)  # the queue is empty now
    assert tm.straggler_status()["slow_workers"][0]["worker"] == 0
    assert clock.now - handed_out < BACKUP_MIN_AGE_SECONDS
    assert tm.get(1) == WAIT_TASK  # slow, but its task is younger than the floor
    clock.now = handed_out + BACKUP_MIN_AGE_SECONDS
    copy = tm.get(1)
    assert copy.task_id == stuck.task_id
    assert tm.summary().backups_issued == 1


def test_when_the_slow_worker_reports_first_the_copy_is_dropped(stalled):
    clock, tm, sink, stuck = stalled()
    copy = tm.get(1)
    assert copy.task_id == stuck.task_id
    assert tm.abandoned_workers() == set()
    assert tm.report(stuck.task_id, True, 0)
    assert tm.abandoned_workers() == {1}  # the job's end need not wait for its copy
    assert not tm.report(copy.task_id, True, 1)
    s = tm.summary()
    assert s.finished and s.records_trained == 40 and (s.backups_issued, s.backups_won) == (1, 0)
    assert tm.abandoned_workers() == set()
    assert replayed(sink, clock).state() == tm.state()


def test_a_dead_holder_leaves_the_task_to_the_other(stalled):
    clock, tm, sink, stuck = stalled()
    tm.get(1)
    assert tm.recover_tasks(0) == [stuck.task_id]  # the slow one died: not re-queued
    assert tm.summary().tasks_todo == 0
    assert tm.report(stuck.task_id, True, 1)
    assert tm.summary().records_trained == 40
    # And the other way round: the copy's holder dies, the slow worker's report counts.
    clock2, tm2, sink2, stuck2 = stalled()
    tm2.get(1)
    tm2.recover_tasks(1)
    assert tm2.straggler_status()["backups_issued"] == 1
    assert tm2.report(stuck2.task_id, True, 0)
    assert tm2.summary().records_trained == 40
    for sink_, clock_, live in ((sink, clock, tm), (sink2, clock2, tm2)):
        assert replayed(sink_, clock_).state() == live.state()


def test_a_failure_of_one_holder_is_not_the_tasks(stalled):
    clock, tm, sink, stuck = stalled(max_task_retries=0)
    tm.get(1)
    assert tm.report(stuck.task_id, False, 0, err_message="boom")  # the copy goes on
    assert not tm.failed_message and tm.summary().tasks_retried == 0
    assert tm.report(stuck.task_id, True, 1)
    assert tm.summary().records_trained == 40 and tm.finished
    assert replayed(sink, clock).state() == tm.state()


def test_a_repeated_report_and_get_gets_the_same_copy(stalled):
    clock, tm, sink, stuck = stalled(more=1)
    last = tm.get(1)
    clock.now += 1
    copy = tm.report_and_get(last.task_id, True, 1)
    assert copy.task_id == stuck.task_id
    assert tm.report_and_get(last.task_id, True, 1).task_id == copy.task_id  # answer lost
    rebuilt = replayed(sink, clock)
    assert rebuilt.state() == tm.state()
    assert rebuilt.report_and_get(last.task_id, True, 1).task_id == copy.task_id


def test_a_snapshot_keeps_the_copies(stalled):
    clock, tm, _, stuck = stalled()  # rebuilt from a snapshot below, not from the journal
    tm.get(1)
    sink = MemorySink()
    sink.snapshot(tm.state())
    rebuilt = replayed(sink, clock)
    assert rebuilt.state() == tm.state()
    assert rebuilt.report(stuck.task_id, True, 1)
    assert not rebuilt.report(stuck.task_id, True, 0)


def test_a_slow_worker_gets_no_more_than_its_share_near_the_end():
    clock = Clock()
    tm = manager(clock, shards=(("f", 0, 200),))
    sink = journaled(tm)
    # Worker 0 trains at 10 s a task, worker 1 at 1 s a task.
    warm_up(tm, clock)
    first = tm.get(0)
    run_fast(tm, clock, 1, 10)
    assert tm.report(first.task_id, True, 0)
    slow_task = tm.get(0)  # 37 tasks queued: its share is 3.4 of them
    assert slow_task.type == TaskType.TRAINING
    run_fast(tm, clock, 1, 32)
    status = tm.straggler_status()
    assert [w["worker"] for w in status["slow_workers"]] == [0]
    assert tm.get(0) == WAIT_TASK  # 4 tasks queued: its share is under one more
    assert tm.straggler_status()["tasks_withheld"] == 1
    run_fast(tm, clock, 1, 4)
    assert tm.report(slow_task.task_id, True, 0)
    s = tm.summary()
    assert s.finished and s.records_trained == s.records_expected == 200
    assert replayed(sink, clock, shards=(("f", 0, 200),)).state() == tm.state()


def test_while_epochs_remain_a_slow_worker_gets_tasks():
    clock = Clock()
    tm = TaskManager(
        TaskManagerConfig(records_per_task=4, num_epochs=5, straggler_factor=3.0),
        training_shards=[("f", 0, 16)],
        clock=clock,
    )
    warm_up(tm, clock)
    first = tm.get(0)
    run_fast(tm, clock, 1, 10)
    assert tm.report(first.task_id, True, 0)
    assert tm.get(0).type == TaskType.TRAINING  # epochs 4 and 5 still to come


def test_without_a_factor_nothing_is_backed_up():
    clock = Clock()
    tm = manager(clock, factor=0.0)
    warm_up(tm, clock)
    stuck = tm.get(0)
    run_fast(tm, clock, 1, 7)
    assert tm.get(1) == WAIT_TASK
    assert tm.straggler_status()["slow_workers"] == []
    assert tm.report(stuck.task_id, True, 0) and tm.finished


def test_a_factor_under_one_is_refused():
    with pytest.raises(ValueError, match="straggler_factor must be 0"):
        TaskManagerConfig(records_per_task=4, straggler_factor=0.5)
