"""Task leases in the task manager: several tasks per call, shrinking near the end of an
epoch, a dead worker's whole lease re-queued, a repeated call answered with the same tasks,
every record once across random interleavings, and all of it replayed from the journal."""
import random

import pytest
from elasticdl.master.journal import MemorySink
from elasticdl.master.task_leases import MAX_LEASE_TASKS
from elasticdl.master.task_manager import TaskManager, TaskManagerConfig, TaskType
from elasticdl.master.tasks import NO_MORE_TASKS, WAIT_TASK


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def manager(clock=None, tasks=40, epochs=1, evaluation=(), **kw):
    return TaskManager(
        TaskManagerConfig(records_per_task=4, num_epochs=epochs, **kw),
        training_shards=[("f", 0, 4 * tasks)],
        evaluation_shards=list(evaluation),
        clock=clock or Clock(),
    )


def ok(*tasks):
    """Successful results of ``tasks`` as ``lease`` takes them."""
    return [dict(task_id=t.task_id, success=True) for t in tasks]


def test_a_lease_hands_out_k_tasks_each_owned_and_counted_once():
    tm = manager()
    lease = tm.lease(1, [], 4)
    assert [t.type for t in lease] == [TaskType.TRAINING] * 4
    assert len({t.task_id for t in lease}) == 4
    assert tm.summary().tasks_doing == 4 and tm.doing_workers() == {1}
    nxt = tm.lease(1, ok(*lease), 4)
    s = tm.summary()
    assert s.tasks_done == 4 and s.records_trained == 16 and len(nxt) == 4
    assert not set(t.task_id for t in nxt) & set(t.task_id for t in lease)
    assert tm.lease(1, ok(*nxt), 0) == [] and tm.summary().tasks_done == 8


def test_a_lease_is_capped():
    tm = manager(tasks=200)
    assert len(tm.lease(1, [], 10_000)) == MAX_LEASE_TASKS


def test_a_lease_shrinks_to_the_workers_share_near_the_end_of_an_epoch():
    tm = manager(tasks=10, epochs=2)
    a = tm.lease(1, [], 4)  # the only worker known yet: 4 of 10
    b = tm.lease(2, [], 4)  # 6 queued, 2 workers: a share of 3
    c = tm.lease(1, ok(*a), 4)  # 3 queued: 2
    d = tm.lease(2, ok(*b), 4)  # 1 queued: 1, so no worker sits on it while another idles
    assert [len(x) for x in (a, b, c, d)] == [4, 3, 2, 1]
    # The epoch is empty now: the next lease starts epoch 2, never mixing epochs.
    e = tm.lease(1, ok(*c), 4)
    assert {t.epoch for t in e} == {2} and len(e) == 4
    assert {t.epoch for t in a + b + c + d} == {1}


def test_evaluation_tasks_are_handed_one_at_a_time():
    tm = manager(tasks=8, evaluation=[("v", 0, 12)])
    tm.create_evaluation_tasks(model_version=3)
    assert [t.type for t in tm.lease(1, [], 4)] == [TaskType.EVALUATION]
    assert [t.type for t in tm.lease(2, [], 4)] == [TaskType.EVALUATION]


def test_a_dead_worker_with_a_partly_used_lease_gets_all_its_unfinished_tasks_requeued():
    tm = manager(tasks=12)
    lease = tm.lease(1, [], 4)
    tm.lease(1, ok(lease[0]), 0)  # it finished one, then died holding three
    recovered = tm.recover_tasks(1)
    assert sorted(recovered) == sorted(t.task_id for t in lease[1:])
    assert tm.summary().tasks_doing == 0
    # The others train them (and everything else), each record once.
    held = tm.lease(2, [], 64)
    while held and held[0].task_id:
        held = tm.lease(2, ok(*held), 64)
    assert held == [NO_MORE_TASKS]
    s = tm.summary()
    assert s.finished and s.records_trained == s.records_expected == 48
    # Its late reports are stale, not counted twice.
    tm.lease(1, ok(*lease[1:]), 0)
    assert tm.summary().records_trained == 48


def test_the_same_exchange_repeated_without_a_number_gets_the_same_tasks():
    tm = manager()
    first = tm.lease(1, [], 3)
    second = tm.lease(1, ok(*first), 3)
    again = tm.lease(1, ok(*first), 3)  # its answer was lost: the same call once more
    assert [t.task_id for t in again] == [t.task_id for t in second]
    s = tm.summary()
    assert s.tasks_done == 3 and s.tasks_doing == 3 and s.stale_reports == 3
    # Tasks of that lease it no longer holds (taken back) are not handed out again.
    tm.recover_tasks(1)
    fresh = tm.lease(1, ok(*first), 3)
    assert len(fresh) == 3 and tm.summary().tasks_doing == 3


def test_a_numbered_call_repeated_gets_the_same_tasks_and_its_results_apply_once():
    tm = manager(tasks=2, max_task_retries=5)
    first = tm.lease(1, [], 1, call_id=1)
    failed = [dict(task_id=first[0].task_id, success=False)]
    second = tm.lease(1, failed, 2, call_id=2)  # the failed task comes back in this lease
    assert first[0].task_id in {t.task_id for t in second}
    again = tm.lease(1, failed, 2, call_id=2)
    assert [t.task_id for t in again] == [t.task_id for t in second]
    assert tm.summary().tasks_retried == 1  # not failed a second time by the repeat
    # It fails again in a new call with the very same results: a new call, applied.
    third = tm.lease(1, failed, 2, call_id=3)
    assert tm.summary().tasks_retried == 2 and third[0].task_id == first[0].task_id
    # A repeat after its tasks were taken back: a new lease, its results still applied once.
    tm.recover_tasks(1)
    assert len(tm.lease(1, failed, 2, call_id=3)) == 2
    assert tm.summary().tasks_retried == 2 and tm.summary().tasks_doing == 2


def test_the_first_call_is_not_taken_for_a_repeat():
    tm = manager()
    a = tm.lease(1, [], 2)
    b = tm.lease(1, [], 2)  # no results: cannot be told from a fresh ask, so new tasks
    assert not {t.task_id for t in a} & {t.task_id for t in b}


def test_wait_and_no_more_tasks_come_alone():
    tm = manager(tasks=3)
    a = tm.lease(1, [], 4)
    assert len(a) == 3
    assert tm.lease(2, [], 4) == [WAIT_TASK]  # worker 1 still works: more may come
    assert tm.lease(1, ok(*a), 4) == [NO_MORE_TASKS]


def _random_interleaving(tm, clock, rng, workers=5):
    """Workers lease, fail, die and lose answers at random; returns what each holds."""
    held = {w: [] for w in range(workers)}
    calls = 0
    for _ in range(3000):
        clock.now += rng.random()
        w = rng.randrange(workers)
        r = rng.random()
        if r < 0.05 and held[w]:  # the worker dies
            tm.recover_tasks(w)
            held[w] = []
            continue
        done = held[w][: rng.randrange(len(held[w]) + 1)]
        results = [dict(task_id=t.task_id, success=rng.random() > 0.1) for t in done]
        held[w] = held[w][len(done) :]
        k = rng.randrange(0, 6) if not held[w] else 0
        calls += 1
        got = tm.lease(w, results, k, call_id=calls)
        if r < 0.15:  # the answer was lost: the worker makes the same call again
            clock.now += rng.random()
            got = tm.lease(w, results, k, call_id=calls)
        held[w] += [t for t in got if t.task_id]
        if tm.finished:
            return held
    return held


@pytest.mark.parametrize("seed", range(15))
def test_every_record_once_across_a_random_interleaving_and_replay_gives_the_live_state(seed):
    rng = random.Random(seed)
    clock = Clock()
    live = manager(clock, tasks=60, epochs=2, max_task_retries=100)
    sink = MemorySink()
    live.attach_journal(sink)
    held = _random_interleaving(live, clock, rng)
    rebuilt = manager(tasks=60, epochs=2, max_task_retries=100)
    rebuilt.replay(None, sink.records)
    assert rebuilt.state() == live.state()
    # Whatever was left held is finished by one worker that then drains the queue.
    for w, tasks in held.items():
        live.lease(w, ok(*tasks), 0)
    got = live.lease(99, [], 8)
    while got and got[0].task_id:
        got = live.lease(99, ok(*got), 8)
    s = live.summary()
    assert s.finished and not s.failed_message
    assert s.records_trained == s.records_expected == 2 * 240
    assert s.records_trained_per_epoch == {1: 240, 2: 240}


def test_a_restarted_master_answers_a_repeated_lease_with_the_same_tasks():
    clock = Clock()
    tm = manager(clock)
    sink = MemorySink()
    tm.attach_journal(sink)
    first = tm.lease(1, [], 3, call_id=7)
    second = tm.lease(1, ok(*first), 3, call_id=8)  # journaled; the master dies unanswered
    restarted = manager(clock)
    restarted.replay(sink.state, sink.records)
    restarted.resume_after_restart()
    again = restarted.lease(1, ok(*first), 3, call_id=8)
    assert [t.task_id for t in again] == [t.task_id for t in second]
    s = restarted.summary()
    assert s.tasks_done == 3 and s.tasks_doing == 3 and restarted.doing_workers() == {1}


def test_a_snapshot_keeps_the_last_leases():
    tm = manager()
    sink = MemorySink()
    tm.attach_journal(sink)
    first = tm.lease(1, [], 2)
    tm.lease(1, ok(*first), 2)
    rebuilt = manager()
    rebuilt.restore(tm.state())
    assert rebuilt.state() == tm.state() and "last_lease" in tm.state()
    assert "last_lease" not in manager().state()  # a job without leases: the earlier state


def _paced_workers(tm, clock, fast_s, slow_s, lease_k):
    """Worker 0 takes ``slow_s`` a task, worker 1 ``fast_s``, both leasing up to ``lease_k``."""
    next_free = {0: clock.now, 1: clock.now}
    held = {0: [], 1: []}
    while not tm.finished:
        w = min(next_free, key=next_free.get)
        clock.now = max(clock.now, next_free[w])
        done, held[w] = held[w][:1], held[w][1:]
        got = tm.lease(w, ok(*done), lease_k if not held[w] else 0)
        held[w] += [t for t in got if t.task_id]
        if held[w]:
            next_free[w] = clock.now + (slow_s if w == 0 else fast_s)
        elif got == [WAIT_TASK]:
            next_free[w] = clock.now + 0.5
        elif got == [NO_MORE_TASKS] or not got:
            next_free[w] = clock.now + 0.5 if not tm.finished else float("inf")
    return tm.straggler_status()


def test_a_slow_worker_gets_leases_of_one_and_no_more_than_its_share():
    clock = Clock()
    tm = manager(clock, tasks=200, straggler_factor=3.0)
    status = _paced_workers(tm, clock, fast_s=1.0, slow_s=10.0, lease_k=4)
    s = tm.summary()
    assert s.finished and s.records_trained == s.records_expected == 800
    assert 0 in status["ever_slow"] and 1 not in status["ever_slow"]


def test_leasing_workers_of_the_same_speed_are_not_taken_for_stragglers():
    clock = Clock()
    tm = manager(clock, tasks=200, straggler_factor=3.0)
    status = _paced_workers(tm, clock, fast_s=1.0, slow_s=1.0, lease_k=8)
    assert status["ever_slow"] == [] and status["backups_issued"] == 0
    assert tm.summary().records_trained == 800
