"""Journal operations: every op survives its record (through JSON), records of the earlier
form decode to the same ops, and a record this version does not know is refused by name."""

import json

import pytest
from elasticdl.master import journal_ops as ops
from elasticdl.master.journal import JournalError, MemorySink

EXAMPLES = [
    ops.TaskHandedOut(3, 17),
    ops.TaskHandedOut(3, 18, answering=(17, False)),
    ops.TaskReported(17, 3, True, counters={"records": 8}, model_version=4, duration=1.5),
    ops.TaskReported(18, 3, False, error="boom", handed_out=19),
    ops.TasksRequeued((4, 5)),
    ops.TaskBackedUp(2, 17),
    ops.TaskBackedUp(2, 18, answering=(16, True)),
    ops.TasksLeased(3, (20, 21, 22)),
    ops.TasksLeased(3, (23,), answering=(20, 1, 21, 0), backup=True, call=9),
    ops.BackupsDropped((17, 18)),
    ops.EvaluationTasksCreated(-1),
    ops.EvaluationRoundDropped(10),
    ops.TrainingDone(),
    ops.TasksFailed("task 3 failed 4 times"),
    ops.RoundStarted(10),
    ops.RoundDone(-1, 12, {"accuracy": 0.5}, 1),
    ops.VersionsSeen(12, 10),
    ops.MasterStarted(50001, "ab12", 4242),
    ops.ReplicaLaunching("worker", 2),
    ops.ReplicaLaunched("ps", 0, 1, "high", {"pid": 7, "start": "99"}, "127.0.0.1:2222"),
    ops.ReplicaLaunched("worker", 1, 0, "", None, None),
    ops.ReplicaEnded("worker", 1, "Failed", 137, "OOMKilled", 3),
    ops.PSFailures(0, 2),
    ops.JobFailed("no worker left"),
    ops.ScalingDecided({"action": "add", "workers": 2, "worker": 1, "reason": "r", "gain": None}),
    ops.PSSetChanged(1, 3, 120),
]
TABLES = [ops.TASK_OPS, ops.EVALUATION_OPS, ops.REPLICA_OPS]


def _table_of(op):
    return next(t for t in TABLES if type(op) in t.values())


@pytest.mark.parametrize("op", EXAMPLES, ids=lambda op: type(op).__name__)
def test_an_op_comes_back_from_its_record(op):
    record = json.loads(json.dumps(ops.encode(op)))
    assert ops.decode(record, _table_of(op)) == op


def test_each_owner_knows_every_one_of_its_ops():
    kinds = {type(op) for op in EXAMPLES}
    assert kinds == {cls for table in TABLES for cls in table.values()}


def test_records_of_the_earlier_form_decode():
    assert ops.decode({"o": "g", "w": 1, "t": 5, "a": [4, 1]}, ops.TASK_OPS) == ops.TaskHandedOut(
        1, 5, (4, True)
    )
    assert ops.decode(
        {"o": "r", "t": 4, "w": 1, "s": 1, "c": {"n": 2}, "d": 0.0, "g": 5}, ops.TASK_OPS
    ) == ops.TaskReported(4, 1, True, counters={"n": 2}, handed_out=5)
    assert ops.decode({"o": "q", "t": [2, 3]}, ops.TASK_OPS) == ops.TasksRequeued((2, 3))


def test_values_equal_to_their_default_are_left_out():
    assert ops.encode(ops.TaskReported(4, 1, False)) == {"o": "r", "t": 4, "w": 1, "s": 0}
    assert ops.encode(ops.TrainingDone()) == {"o": "td"}


def test_a_record_this_version_does_not_know_is_refused():
    with pytest.raises(JournalError, match="unknown journal record"):
        ops.decode({"o": "launch", "k": "ps"}, ops.TASK_OPS)
    with pytest.raises(JournalError, match="has no 'w' \\(worker\\)"):
        ops.decode({"o": "g", "t": 5}, ops.TASK_OPS)


def test_owners_record_through_their_sink_and_not_while_replaying():
    class Owner(ops.JournaledOwner):
        OPS = ops.TASK_OPS

    owner, sink = Owner(), MemorySink()
    owner._record(ops.TrainingDone())  # no journal yet: nothing happens
    owner.attach_journal(sink)
    owner._record(ops.TasksFailed("x"))
    owner._replaying = True
    owner._record(ops.TrainingDone())
    assert owner._decode(sink.records) == [ops.TasksFailed("x")]
