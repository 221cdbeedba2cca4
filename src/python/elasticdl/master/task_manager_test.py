import pytest
from elasticdl.common.types import Shard
from elasticdl.master.task_manager import (
    NO_MORE_TASKS,
    TaskManager,
    TaskManagerConfig,
    TaskType,
    split_shards,
)


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _drain(tm, worker_id=0):
    """Run every task to success on one worker; returns the tasks in order."""
    done = []
    while True:
        task = tm.get(worker_id)
        if task.type in (TaskType.NONE, TaskType.WAIT):
            return done, task
        assert tm.report(task.task_id, True, worker_id)
        done.append(task)


def test_split_contract_example_and_ids():
    tm = TaskManager(TaskManagerConfig(records_per_task=3), training_shards=[("f1", 0, 10)])
    tasks = []
    for _ in range(4):
        t = tm.get(0)
        tasks.append(t)
    assert [(t.shard.name, t.shard.start, t.shard.end) for t in tasks] == [
        ("f1", 0, 3),
        ("f1", 3, 6),
        ("f1", 6, 9),
        ("f1", 9, 10),
    ]
    assert [t.task_id for t in tasks] == [1, 2, 3, 4]
    assert all(t.type == TaskType.TRAINING and t.epoch == 1 for t in tasks)
    # Everything handed out, nothing reported: others are busy -> WAIT, not end.
    assert tm.get(1).type == TaskType.WAIT
    for t in tasks:
        tm.report(t.task_id, True, 0)
    assert tm.get(1) is NO_MORE_TASKS
    assert tm.finished


def test_non_zero_shard_start_and_shard_objects():
    class S:  # what data readers' create_shards() return
        def __init__(self, name, start, end):
            self.name, self.start, self.end = name, start, end

    ranges = split_shards([S("f2", 5, 12), ("f3", 0, 2)], 4)
    assert ranges == [Shard("f2", 5, 9), Shard("f2", 9, 12), Shard("f3", 0, 2)]
    with pytest.raises(ValueError, match="records_per_task"):
        split_shards([("f", 0, 1)], 0)
    with pytest.raises(ValueError, match="invalid shard"):
        split_shards([("f", 5, 1)], 2)


def test_epochs_and_to_pb():
    tm = TaskManager(
        TaskManagerConfig(records_per_task=5, num_epochs=3), training_shards=[("a", 0, 10)]
    )
    done, last = _drain(tm)
    assert last is NO_MORE_TASKS
    assert [t.epoch for t in done] == [1, 1, 2, 2, 3, 3]
    assert [t.task_id for t in done] == [1, 2, 3, 4, 5, 6]
    s = tm.summary()
    assert s.records_trained == s.records_expected == 30
    assert s.records_trained_per_epoch == {1: 10, 2: 10, 3: 10}
    msg = done[3].to_pb()
    assert (msg.task_id, msg.shard.name, msg.shard.start, msg.shard.end, msg.epoch, msg.type) == (
        4,
        "a",
        5,
        10,
        2,
        TaskType.TRAINING,
    )


def test_infinite_epochs_stop_at_max_step():
    cfg = TaskManagerConfig(records_per_task=4, num_epochs=0, minibatch_size=2, max_step=7)
    tm = TaskManager(cfg, training_shards=[("a", 0, 8)])
    done, last = _drain(tm)
    # 2 steps per task -> the 4th task brings 8 >= 7 steps.
    assert len(done) == 4 and last is NO_MORE_TASKS
    s = tm.summary()
    assert s.completed_steps == 8 and s.records_trained == s.records_expected == 16


def test_failure_requeues_then_job_fails_after_retry_limit():
    tm = TaskManager(
        TaskManagerConfig(records_per_task=10, max_task_retries=3), training_shards=[("a", 0, 20)]
    )
    seen = []
    tm.add_done_listener(lambda task, ok, w: seen.append((task.task_id, ok, w)))
    t1 = tm.get(0)
    for attempt in range(3):
        assert tm.report(t1.task_id, False, 0, err_message="bad record")
        # Failed task goes to the back: the other task comes first.
        nxt = tm.get(0)
        if attempt == 0:
            assert nxt.task_id == 2
            tm.report(nxt.task_id, True, 0)
            nxt = tm.get(0)
        assert nxt.task_id == t1.task_id and nxt.retries == attempt + 1
    assert tm.summary().tasks_retried == 3
    tm.report(t1.task_id, False, 0, err_message="bad record")
    assert "failed 4 times" in tm.failed_message and "a[0:10]" in tm.failed_message
    assert "bad record" in tm.failed_message
    assert tm.get(0) is NO_MORE_TASKS and tm.finished
    assert seen == [(2, True, 0), (1, False, 0)]
    s = tm.summary()
    assert s.tasks_failed == 1 and s.records_trained == 10 and s.records_expected == 20


def test_recover_tasks_front_of_queue_without_using_retries():
    tm = TaskManager(TaskManagerConfig(records_per_task=1), training_shards=[("a", 0, 5)])
    a = tm.get(worker_id=7)
    b = tm.get(worker_id=7)
    c = tm.get(worker_id=8)
    assert tm.recover_tasks(7) == [a.task_id, b.task_id]
    assert tm.recover_tasks(7) == []
    again = [tm.get(9), tm.get(9)]
    assert [t.task_id for t in again] == [a.task_id, b.task_id]
    assert all(t.retries == 0 for t in again)
    assert tm.summary().tasks_recovered == 2
    tm.report(c.task_id, True, 8)


def test_stale_report_from_dead_worker_is_ignored_exactly_once():
    tm = TaskManager(
        TaskManagerConfig(records_per_task=5, num_epochs=2), training_shards=[("a", 0, 10)]
    )
    t = tm.get(worker_id=1)
    tm.recover_tasks(1)  # worker 1 died
    t2 = tm.get(worker_id=2)
    assert t2.task_id == t.task_id
    # Late report from the dead worker: ignored (worker 2 owns the task now).
    assert tm.report(t.task_id, True, worker_id=1) is False
    assert tm.report(t.task_id, False, worker_id=1) is False
    assert tm.report(t2.task_id, True, worker_id=2) is True
    # A second success for the same task from anyone is stale too.
    assert tm.report(t2.task_id, True, worker_id=2) is False
    done, last = _drain(tm, worker_id=2)
    assert last is NO_MORE_TASKS
    s = tm.summary()
    assert s.records_trained == s.records_expected == 20
    assert s.records_trained_per_epoch == {1: 10, 2: 10}
    assert s.stale_reports == 3 and s.tasks_done == 4


def test_late_success_of_requeued_unassigned_task_is_accepted():
    tm = TaskManager(TaskManagerConfig(records_per_task=5), training_shards=[("a", 0, 10)])
    t = tm.get(worker_id=1)
    tm.recover_tasks(1)  # e.g. timed out, but it was just slow
    assert tm.report(t.task_id, True, worker_id=1) is True
    done, _ = _drain(tm, worker_id=2)
    assert [d.shard.start for d in done] == [5]
    s = tm.summary()
    assert s.records_trained == s.records_expected == 10


def test_timeouts_take_back_tasks_of_hung_workers():
    clock = FakeClock()
    cfg = TaskManagerConfig(records_per_task=1, timeout_floor_s=300, timeout_factor=3)
    tm = TaskManager(cfg, training_shards=[("a", 0, 4)], clock=clock)
    t1 = tm.get(1)
    clock.now += 200
    tm.report(t1.task_id, True, 1)  # longest task so far: 200 s -> limit 600 s
    t2 = tm.get(2)
    t3 = tm.get(3)
    clock.now += 500
    assert tm.check_timeouts() == {}
    clock.now += 101
    assert tm.check_timeouts() == {2: [t2.task_id], 3: [t3.task_id]}
    assert tm.get(4).task_id == t2.task_id


def test_train_end_callback_after_last_training_task():
    cfg = TaskManagerConfig(records_per_task=5, saved_model_path="/tmp/out")
    tm = TaskManager(cfg, training_shards=[("a", 0, 10)])
    t1, t2 = tm.get(0), tm.get(1)
    tm.report(t1.task_id, True, 0)
    assert tm.get(0).type == TaskType.WAIT  # not before all training is done
    tm.report(t2.task_id, True, 1)
    end = tm.get(0)
    assert end.type == TaskType.TRAIN_END_CALLBACK
    assert end.extended_config == {"saved_model_path": "/tmp/out"}
    assert end.to_pb().extended_config["saved_model_path"] == "/tmp/out"
    assert tm.get(1).type == TaskType.WAIT and not tm.finished
    tm.recover_tasks(0)  # exporter died: another worker does it
    again = tm.get(1)
    assert again.task_id == end.task_id
    tm.report(again.task_id, True, 1)
    assert tm.get(1) is NO_MORE_TASKS and tm.finished


def test_evaluation_tasks_first_and_final_evaluation_hook():
    tm = TaskManager(
        TaskManagerConfig(records_per_task=5),
        training_shards=[("train", 0, 10)],
        evaluation_shards=[("val", 0, 7)],
    )
    fired = []
    tm.add_training_done_listener(lambda: fired.append(tm.create_evaluation_tasks(-1)))
    t = tm.get(0)
    ids = tm.create_evaluation_tasks(50)
    e1, e2 = tm.get(1), tm.get(2)
    assert [e1.task_id, e2.task_id] == ids
    assert (e1.type, e1.model_version, e2.shard) == (
        TaskType.EVALUATION,
        50,
        Shard("val", 5, 7),
    )
    tm.report(e1.task_id, False, 1)
    assert tm.get(1).task_id == e1.task_id  # failed eval task back in the eval queue
    for task_id, w in ((e1.task_id, 1), (e2.task_id, 2), (t.task_id, 0)):
        tm.report(task_id, True, w)
    t2 = tm.get(0)
    assert t2.type == TaskType.TRAINING
    tm.report(t2.task_id, True, 0)
    assert len(fired) == 1 and len(fired[0]) == 2
    final = [tm.get(0), tm.get(0)]
    assert all(f.type == TaskType.EVALUATION and f.model_version == -1 for f in final)
    for f in final:
        tm.report(f.task_id, True, 0)
    assert tm.get(0) is NO_MORE_TASKS
    assert len(fired) == 1


def test_prediction_job():
    tm = TaskManager(TaskManagerConfig(records_per_task=4), prediction_shards=[("p", 0, 10)])
    done, last = _drain(tm)
    assert [t.type for t in done] == [TaskType.PREDICTION] * 3 and last is NO_MORE_TASKS
    assert tm.summary().records_predicted == 10
    with pytest.raises(ValueError, match="cannot both train and predict"):
        TaskManager(
            TaskManagerConfig(records_per_task=4),
            training_shards=[("t", 0, 1)],
            prediction_shards=[("p", 0, 1)],
        )


def test_config_validation_messages():
    with pytest.raises(ValueError, match="num_minibatches_per_task"):
        TaskManagerConfig(records_per_task=0)
    with pytest.raises(ValueError, match="max_step"):
        TaskManagerConfig(records_per_task=1, max_step=5)


def test_shuffle_is_deterministic_per_epoch():
    cfg = TaskManagerConfig(records_per_task=1, num_epochs=2, shuffle=True, seed=3)
    orders = []
    for _ in range(2):
        tm = TaskManager(cfg, training_shards=[("a", 0, 8)])
        done, _ = _drain(tm)
        orders.append([t.shard.start for t in done])
    assert orders[0] == orders[1]
    assert sorted(orders[0][:8]) == list(range(8)) and orders[0][:8] != list(range(8))
