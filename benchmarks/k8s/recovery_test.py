"""recovery.py's reading of a real master journal: who holds which task, re-queues,
replacements, and the end of training, which stops a wait that can no longer succeed."""

from __future__ import annotations

import pytest
import recovery  # pants: no-infer-dep (beside this file: the BUILD names it)
from elasticdl.master import journal_ops
from elasticdl.master.journal import Journal


def test_the_tail_follows_tasks_requeues_replacements_and_the_end_of_training(tmp_path):
    journal = Journal(tmp_path, "tasks", fsync_interval_s=0)
    journal.open()
    tail = recovery.JournalTail(tmp_path)
    journal.record({"o": "g", "t": 1, "w": 0})
    journal.record({"o": "g", "t": 2, "w": 1})
    tail.poll()
    assert tail.busy_workers() == {0, 1} and tail.training_done_at is None
    journal.record({"o": "r", "t": 1, "w": 0, "s": 1, "g": 3})
    journal.record({"o": "q", "t": [2]})
    journal.record({"o": "end", "k": "worker", "i": 1, "by": 2})
    tail.poll()
    assert tail.held == {3: 0} and 0 in tail.finished and 1 not in tail.finished
    assert [ids for _, ids in tail.requeued] == [[2]] and tail.replaced_by[1][1] == 2
    journal.record({"o": "td"})
    tail.poll()
    assert tail.training_done_at is not None
    journal.close()


def test_the_tasks_of_a_lease_are_held_until_reported_or_requeued(tmp_path):
    journal = Journal(tmp_path, "tasks", fsync_interval_s=0)
    journal.open()
    tail = recovery.JournalTail(tmp_path)
    journal.record(journal_ops.encode(journal_ops.TasksLeased(worker=0, tasks=(4, 5, 6), call=1)))
    tail.poll()
    assert tail.held == {4: 0, 5: 0, 6: 0} and tail.busy_workers() == {0}
    journal.record({"o": "r", "t": 4, "w": 0, "s": 1})
    journal.record({"o": "q", "t": [5, 6]})
    tail.poll()
    assert tail.held == {} and tail.busy_workers() == set()
    journal.close()


def test_waiting_for_a_victim_ends_at_once_when_training_is_done(tmp_path):
    journal = Journal(tmp_path, "tasks", fsync_interval_s=0)
    journal.open()
    journal.record({"o": "td"})
    journal.close()
    tail = recovery.JournalTail(tmp_path)
    with pytest.raises(recovery.JobEndedEarly, match="finished training while waiting for x"):
        recovery.until(recovery._unless_training_done(tail, lambda: tail.poll(), "x"), 30, "x")
