"""How fast each worker goes, and which is slow: paces measured over spans of at least
PACE_MIN_SECONDS of work, and the lower bound of a task that has run that long."""
import pytest
from elasticdl.master.stragglers import PACE_MIN_SECONDS, StragglerTracker

TASK = 128  # records per task
FAST = 0.03  # seconds per task of a healthy worker
SPAN_TASKS = int(PACE_MIN_SECONDS / FAST) + 1  # a healthy worker's tasks in one span


def measured(tracker, worker, now, seconds, spans=3):
    """``worker`` warms up, then reports tasks of ``seconds`` each (a list: those, in turn)
    for ``spans`` spans of a healthy worker's tasks from ``now``; returns the last report's
    time."""
    durations = seconds if isinstance(seconds, list) else [seconds] * (spans * SPAN_TASKS)
    tracker.started(worker, now)
    now += FAST
    tracker.reported(worker, TASK, now)  # its warm-up, not measured
    for d in durations:
        now += d
        tracker.reported(worker, TASK, now)
        tracker.slow(now, {})  # as the master judges at each request
    return now


def test_a_peer_that_just_began_its_first_measured_task_is_no_yardstick():
    # Worker 1 is past its warm-up only: its pace would be the task it has just begun, zero
    # seconds long. Measured against that, worker 0 looked a thousand times slower.
    tracker = StragglerTracker(factor=3.0)
    now = measured(tracker, 0, 0.0, FAST)
    tracker.started(1, now - 5.0)
    tracker.reported(1, TASK, now)  # warm-up
    running = {0: TASK, 1: TASK}
    assert tracker.pace(0, now) == pytest.approx(FAST / TASK)
    assert tracker.pace(1, now, TASK) is None
    assert tracker.slow(now, running) == {}
    assert tracker.slow(now + 0.2, running) == {}
    assert tracker.ever_slow == set()


def test_a_blip_shorter_than_a_span_is_not_slowness():
    # Worker 1 takes 30 times its usual time over one task (a checkpoint, a step traced
    # again) among healthy ones: diluted in its span, as its peer's own blips are.
    tracker = StragglerTracker(factor=3.0)
    blip = [FAST] * (2 * SPAN_TASKS) + [30 * FAST] + [FAST] * (2 * SPAN_TASKS)
    now = max(measured(tracker, 0, 0.0, FAST, spans=4), measured(tracker, 1, 0.0, blip))
    assert tracker.pace(1, now) < 1.5 * tracker.pace(0, now)
    assert tracker.slow(now, {}) == {} and tracker.ever_slow == set()


def test_a_pause_within_a_task_counts_once_it_lasts_a_span():
    tracker = StragglerTracker(factor=3.0)
    now = max(measured(tracker, 0, 0.0, FAST), measured(tracker, 1, 0.0, FAST))
    # Worker 1's task has run 5 times its usual time, for a fraction of a second.
    assert tracker.slow(now + 5 * FAST, {1: TASK}) == {}
    # Stalled for a span, it is slow before it reports.
    later = now + PACE_MIN_SECONDS
    slow = tracker.slow(later, {1: TASK})
    assert list(slow) == [1] and slow[1] == pytest.approx(PACE_MIN_SECONDS / FAST, rel=0.05)
    assert tracker.ever_slow == {1}


def test_a_worker_slow_over_a_span_is_slow_between_its_tasks():
    tracker = StragglerTracker(factor=3.0)
    now = measured(tracker, 0, 0.0, FAST)
    # Five times slower from its first measured task on: slow after its first span.
    now = max(now, measured(tracker, 1, 0.0, [5 * FAST] * (SPAN_TASKS // 5 + 1)))
    slow = tracker.slow(now, {})
    assert list(slow) == [1] and slow[1] == pytest.approx(5.0, rel=0.05)


def test_a_worker_alone_is_never_slow():
    tracker = StragglerTracker(factor=3.0)
    now = measured(tracker, 0, 0.0, FAST)
    assert tracker.slow(now + 10 * PACE_MIN_SECONDS, {0: TASK}) == {}
