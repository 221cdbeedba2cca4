"""How fast each worker goes, and which is slow: measured paces, and the lower bound of a
task that runs on, which counts only once the task has run STALL_MIN_SECONDS."""
import pytest
from elasticdl.master.stragglers import STALL_MIN_SECONDS, StragglerTracker

TASK = 128  # records per task
FAST = 0.03  # seconds per task of a healthy worker


def measured(tracker, worker, now, seconds_per_task, tasks=4):
    """``worker`` warms up, then reports ``tasks`` tasks of ``seconds_per_task`` each from
    ``now``; returns the time of its last report."""
    tracker.started(worker, now)
    tracker.reported(worker, TASK, now + seconds_per_task)  # its warm-up, not measured
    for k in range(2, tasks + 2):
        tracker.reported(worker, TASK, now + k * seconds_per_task)
    return now + (tasks + 1) * seconds_per_task


def test_a_peer_that_just_began_its_first_measured_task_is_no_yardstick():
    # Worker 1 is past its warm-up only: its pace is the task it has just begun, zero seconds
    # long. Measured against that, worker 0 looked a thousand times slower than its peer.
    tracker = StragglerTracker(factor=3.0)
    now = measured(tracker, 0, 0.0, FAST)
    tracker.started(1, now - 5.0)
    tracker.reported(1, TASK, now)  # warm-up
    running = {0: TASK, 1: TASK}
    assert tracker.pace(1, now, TASK) is None
    assert tracker.slow(now, running) == {}
    assert tracker.slow(now + 0.2, running) == {}
    assert tracker.ever_slow == set()


def test_a_pause_shorter_than_the_stall_floor_is_not_slowness():
    tracker = StragglerTracker(factor=3.0)
    now = max(measured(tracker, 0, 0.0, FAST), measured(tracker, 1, 0.0, FAST))
    running = {0: TASK, 1: TASK}
    # Worker 1's task has run 5 times its usual time, for a fraction of a second.
    assert tracker.slow(now + 5 * FAST, running) == {}
    assert tracker.pace(1, now + 5 * FAST, TASK) == pytest.approx(FAST / TASK)
    # Stalled past the floor, it is slow before it reports.
    later = now + STALL_MIN_SECONDS
    slow = tracker.slow(later, {1: TASK})
    assert list(slow) == [1] and slow[1] == pytest.approx(STALL_MIN_SECONDS / FAST, rel=0.01)
    assert tracker.ever_slow == {1}


def test_a_worker_measured_slow_is_slow_between_its_tasks():
    tracker = StragglerTracker(factor=3.0)
    now = max(measured(tracker, 0, 0.0, FAST), measured(tracker, 1, 0.0, 5 * FAST))
    slow = tracker.slow(now, {})
    assert list(slow) == [1] and slow[1] == pytest.approx(5.0, rel=0.05)
    assert tracker.slow(now, {}) == slow  # no running task needed


def test_a_worker_alone_is_never_slow():
    tracker = StragglerTracker(factor=3.0)
    now = measured(tracker, 0, 0.0, FAST)
    assert tracker.slow(now + 10 * STALL_MIN_SECONDS, {0: TASK}) == {}
