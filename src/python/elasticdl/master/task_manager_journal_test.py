"""Replay equivalence: a task manager rebuilt from its journal is the one that wrote it."""
import random

import pytest
from elasticdl.master.journal import Journal, JournalError, MemorySink
from elasticdl.master.task_manager import TaskManager, TaskManagerConfig, TaskType


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _new(clock=None, **kw):
    config = dict(records_per_task=3, num_epochs=2, minibatch_size=1, shuffle=True, seed=3)
    config.update(kw)
    return TaskManager(
        TaskManagerConfig(**config),
        training_shards=[("a", 0, 20), ("b", 5, 17)],
        evaluation_shards=[("v", 0, 7)],
        clock=clock or FakeClock(),
    )


def _random_ops(tm, clock, rng, steps, workers=4, slow=None):
    """``slow``: a worker that reports a fifth as often as the others."""
    held = {w: [] for w in range(workers)}
    for _ in range(steps):
        clock.now += rng.random()
        w = rng.randrange(workers)
        r = rng.random()
        if r < 0.35:
            t = tm.get(w)
            if t.task_id:
                held[w].append(t.task_id)
        elif r < 0.7 and held[w] and (w != slow or rng.random() < 0.2):
            tid = held[w].pop(rng.randrange(len(held[w])))
            ok = rng.random() < 0.85
            if rng.random() < 0.5:
                t = tm.report_and_get(tid, ok, w, {"records": 3}, "" if ok else "boom", 5)
                if t.task_id:
                    held[w].append(t.task_id)
            else:
                tm.report(tid, ok, w, {"records": 3}, "" if ok else "boom", rng.randrange(9))
        elif r < 0.75:
            tm.recover_tasks(w)
            held[w] = []
        elif r < 0.8:
            tm.report(rng.randrange(1, 60), True, w)  # stale or someone else's
        elif r < 0.83:
            tm.create_evaluation_tasks(rng.choice([-1, 10, 20]))
        elif r < 0.85:
            tm.drop_evaluation_round(rng.choice([-1, 10, 20]))
        elif r < 0.87:
            clock.now += 400
            tm.check_timeouts()
        if tm.finished:
            break


@pytest.mark.parametrize("seed", range(25))
def test_replay_of_random_operations_gives_the_live_state(seed):
    rng = random.Random(seed)
    clock = FakeClock()
    retries = rng.choice([0, 1, 3])
    live = _new(clock, max_task_retries=retries)
    if seed % 2:  # the final evaluation's tasks are created from inside reports and gets
        from elasticdl.master.evaluation_service import EvaluationService

        EvaluationService(live, lambda: {"mae": _abs_error}, evaluation_steps=0)
    sink = MemorySink()
    live.attach_journal(sink)
    _random_ops(live, clock, rng, steps=rng.randrange(50, 400))
    rebuilt = _new(max_task_retries=retries)
    rebuilt.replay(None, sink.records)
    assert rebuilt.state() == live.state()
    assert rebuilt.summary() == live.summary()


@pytest.mark.parametrize("seed", range(10))
def test_snapshot_then_records_gives_the_live_state(seed, tmp_path):
    rng = random.Random(100 + seed)
    clock = FakeClock()
    live = _new(clock)
    journal = Journal(tmp_path, "tasks", fsync_interval_s=0, compact_every=rng.randrange(5, 40))
    journal.open()
    live.attach_journal(journal)
    _random_ops(live, clock, rng, steps=300)
    journal.close()
    assert any(p.suffix == ".snap" for p in tmp_path.iterdir())
    rebuilt = _new()
    rebuilt.replay(*Journal(tmp_path, "tasks").replay())
    assert rebuilt.state() == live.state()


def test_replay_with_stragglers_backed_up_gives_the_live_state(tmp_path):
    backups = 0
    for seed in range(30):
        rng = random.Random(200 + seed)
        clock = FakeClock()
        live = _new(clock, num_epochs=1, straggler_factor=2.0)
        directory = tmp_path / str(seed)
        journal = Journal(
            directory, "tasks", fsync_interval_s=0, compact_every=rng.randrange(5, 60)
        )
        journal.open()
        live.attach_journal(journal)
        _random_ops(live, clock, rng, steps=400, slow=0)
        journal.close()
        rebuilt = _new(num_epochs=1, straggler_factor=2.0)
        rebuilt.replay(*Journal(directory, "tasks").replay())
        assert rebuilt.state() == live.state(), seed
        assert rebuilt.summary() == live.summary(), seed
        backups += live.summary().backups_issued
    assert backups > 0  # the seeds do back up tasks


def test_the_whole_job_after_a_crash_counts_every_task_once():
    """Crash with tasks handed out, some answers lost: the new master finishes the job with
    every record trained once."""
    clock = FakeClock()
    tm = _new(clock, num_epochs=1, shuffle=False)
    sink = MemorySink()
    tm.attach_journal(sink)
    a = tm.get(0)  # worker 0 holds a, and will report it to the new master
    b = tm.get(1)
    c = tm.report_and_get(b.task_id, True, 1, {"records": 3})  # answer c "lost"
    d = tm.get(2)  # answer lost: worker 2 never saw d

    new = _new(FakeClock(), num_epochs=1, shuffle=False)
    new.replay(None, sink.records)
    assert sorted(new.resume_after_restart()) == sorted([a.task_id, c.task_id, d.task_id])
    # Worker 1 repeats the call whose answer it lost: same task, b counted once.
    again = new.report_and_get(b.task_id, True, 1, {"records": 3})
    assert again.task_id == c.task_id
    assert new.summary().tasks_done == 1 and new.summary().stale_reports == 1
    # Worker 0 reports a: accepted once.
    assert new.report(a.task_id, True, 0)
    assert not new.report(a.task_id, True, 0)
    # Worker 2 asks for work without reporting d: after the grace d is re-queued.
    new._clock.now += 1
    e = new.get(2)
    assert e.task_id not in (d.task_id,)
    f = new.report_and_get(c.task_id, True, 1, {"records": 3})  # worker 1 trained c
    new._clock.now += new.inherited_grace_s + 1
    assert new.requeue_unclaimed() == [d.task_id]
    done = {a.task_id, b.task_id, c.task_id}
    held = {1: [f.task_id], 2: [e.task_id]}
    while not new.finished:
        for w in (1, 2):
            for tid in held[w]:
                assert new.report(tid, True, w, {"records": 3})
                done.add(tid)
            t = new.get(w)
            held[w] = [t.task_id] if t.task_id else []
    s = new.summary()
    assert s.records_trained == s.records_expected == 32
    assert s.tasks_done == len(done) == 11


def test_a_journal_of_other_data_is_refused():
    tm = _new()
    sink = MemorySink()
    tm.attach_journal(sink)
    tm.get(0)
    other = TaskManager(TaskManagerConfig(records_per_task=3), evaluation_shards=[("v", 0, 7)])
    with pytest.raises(JournalError, match="other data"):
        other.replay(None, sink.records)


def test_training_done_is_not_fired_twice_after_replay():
    tm = _new(num_epochs=1)
    fired = []
    tm.add_training_done_listener(lambda: fired.append(1))
    sink = MemorySink()
    tm.attach_journal(sink)
    while True:
        t = tm.get(0)
        if t.task_id == 0 or t.type != TaskType.TRAINING:
            break
        tm.report(t.task_id, True, 0)
    assert fired == [1]
    new = _new(num_epochs=1)
    again = []
    new.add_training_done_listener(lambda: again.append(1))
    new.replay(None, sink.records)
    assert new.training_done_fired and new.get(0).task_id == 0 and again == []


def _abs_error(labels, predictions):
    import numpy as np

    return np.abs(np.asarray(labels, float) - np.asarray(predictions, float)).reshape(-1)


def _eval_job():
    from elasticdl.master.evaluation_service import EvaluationService

    tm = TaskManager(
        TaskManagerConfig(records_per_task=5),
        training_shards=[("train", 0, 10)],
        evaluation_shards=[("val", 0, 10)],
    )
    return tm, EvaluationService(tm, lambda: {"mae": _abs_error}, evaluation_steps=10)


def _run_eval_task(tm, es, worker, task, value):
    import numpy as np

    es.report_evaluation_metrics(
        {"output": np.full(5, value)}, np.zeros(5), worker, task.task_id, 10
    )
    assert tm.report(task.task_id, True, worker)


def test_an_open_evaluation_round_runs_again_after_a_restart():
    tm, es = _eval_job()
    tsink, esink = MemorySink(), MemorySink()
    tm.attach_journal(tsink)
    es.attach_journal(esink)
    es.report_version(10)  # round of version 10: 2 tasks
    first = tm.get(0)
    _run_eval_task(tm, es, 0, first, 9.0)  # its outputs die with the master
    tm.get(0)  # handed out, never reported

    tm2, es2 = _eval_job()
    tm2.replay(None, tsink.records)
    es2.replay(None, esink.records)
    assert tm2.summary().tasks_done == 1
    tm2.resume_after_restart()
    tm2.attach_journal(MemorySink())
    assert es2.resume_after_restart() == [10]
    assert tm2.summary().tasks_done == 0 and es2.model_version == 10
    # The round starts over with new tasks; only this life's outputs count.
    for _ in range(2):
        task = tm2.get(1)
        assert task.type == TaskType.EVALUATION and task.model_version == 10
        _run_eval_task(tm2, es2, 1, task, 1.0)
    assert [r.metrics for r in es2.history] == [{"mae": 1.0}]
    # A finished round is history after the next restart, not run again.
    tm3, es3 = _eval_job()
    es3.replay(None, esink.records + [{"o": "done", "v": 10, "r": 10, "m": {"mae": 1.0}, "f": 0}])
    assert es3.resume_after_restart() == [] and es3.latest.metrics == {"mae": 1.0}


def test_a_master_killed_while_draining_for_a_ps_change_hands_out_tasks_again():
    """Dispatch was held for a change of the PS count (ps_rescale) when the master died: the
    hold is not journaled, so the restarted master, running the old PS set, hands out tasks at
    once and every record is still trained once."""
    tm = _new(FakeClock(), num_epochs=1, shuffle=False)
    sink = MemorySink()
    tm.attach_journal(sink)
    a = tm.get(0)
    tm.hold()
    assert tm.get(1).task_id == 0 and tm.in_flight() == 1  # held: worker 1 waits

    new = _new(FakeClock(), num_epochs=1, shuffle=False)
    new.replay(None, sink.records)
    assert new.resume_after_restart() == [a.task_id]
    assert not new.held
    b = new.get(1)
    assert b.task_id and b.task_id != a.task_id
    assert new.report(a.task_id, True, 0, {"records": 3})
    done, held = {a.task_id}, {1: b.task_id}
    while not new.finished:
        tid = held[1]
        if tid:
            assert new.report(tid, True, 1, {"records": 3})
            done.add(tid)
        held[1] = new.get(1).task_id
    s = new.summary()
    assert s.records_trained == s.records_expected == 32 and len(done) == s.tasks_done
