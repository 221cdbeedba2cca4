"""A restarted master adopts the replicas a previous master's LocalProcessPlatform launched
(real processes; the previous master is a platform instance this test stops using)."""

import os
import queue
import signal
import time

import pytest
from elasticdl.platform.base import ReplicaPhase
from elasticdl.platform.local import JOB_OWNER_ENV, LocalProcessPlatform

from .local_test import _spec, _until_terminal

# Ends with status 0, through the exit-status recording every replica main uses.
FINISHES = (
    "import sys, time; from elasticdl.common.parent_watch import run_main; "
    "sys.exit(run_main(lambda: (time.sleep({s}), 0)[1]))"
)
SLEEPS = "import time; time.sleep(60)"


def _platform(job_dir):
    p = LocalProcessPlatform("unit", job_dir)
    p.events = queue.Queue()
    p.add_event_listener(p.events.put)
    return p


@pytest.fixture
def two_lives(tmp_path):
    first, second = _platform(tmp_path / "job"), _platform(tmp_path / "job")
    yield first, second
    second.shutdown(delete_all=True, grace_seconds=2)
    first.shutdown(delete_all=True, grace_seconds=2)


def _environ(pid):
    deadline = time.monotonic() + 5
    while True:  # empty until the new program runs
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
        if any(e.startswith(b"ELASTICDL_EXIT_STATUS_FILE=") for e in env):
            return env
        assert time.monotonic() < deadline, env
        time.sleep(0.05)


def _running(events):
    ev = events.get(timeout=10)
    assert ev.phase == ReplicaPhase.RUNNING, ev
    return ev


def test_adopted_replica_is_watched_and_its_exit_status_read(two_lives):
    first, second = two_lives
    spec = _spec("worker", 3, FINISHES.format(s=2))
    first.launch(spec)
    identity = first.replica_identity("worker", 3)
    assert identity["pid"] > 0 and identity["start"]
    assert second.adopt(spec, identity)
    _running(second.events)
    assert second.replica_pid("worker", 3) == identity["pid"]
    ev, _ = _until_terminal(second.events)
    assert ev.phase == ReplicaPhase.SUCCEEDED and ev.exit_code == 0
    assert second.exit_status_path("worker", 3).read_text().strip() == "0"


def test_adopted_replica_killed_reports_137_and_can_be_deleted(two_lives):
    first, second = two_lives
    a, b = _spec("worker", 0, SLEEPS), _spec("ps", 0, SLEEPS, port=5555)
    first.launch(a)
    first.launch(b)
    assert second.adopt(a, first.replica_identity("worker", 0))
    assert second.adopt(b, first.replica_identity("ps", 0))
    assert second.address("ps", 0).endswith(":5555")
    _running(second.events)
    _running(second.events)
    os.kill(first.replica_pid("worker", 0), signal.SIGKILL)
    ev, _ = _until_terminal(second.events)
    assert (ev.replica_id, ev.phase, ev.exit_code) == (0, ReplicaPhase.FAILED, 137)
    assert ev.looks_preempted
    pid = second.replica_pid("ps", 0)
    second.delete("ps", 0, grace_seconds=2)
    ev, _ = _until_terminal(second.events)
    assert ev.phase == ReplicaPhase.DELETED
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)  # the first platform's watcher reaps its child
    assert not os.path.exists(f"/proc/{pid}")


def test_a_process_that_is_not_the_recorded_replica_is_not_adopted(two_lives):
    first, second = two_lives
    spec = _spec("worker", 1, SLEEPS)
    first.launch(spec)
    identity = dict(first.replica_identity("worker", 1))
    # Same pid, other start time: the pid was reused by another process.
    assert not second.adopt(spec, {**identity, "start": "1"})
    ev = second.events.get(timeout=5)
    assert ev.phase == ReplicaPhase.FAILED and ev.exit_code == 137
    assert second.replica_pid("worker", 1) is None
    # A live process of this user that lacks the replica's exit-status file in its environment.
    assert not second.adopt(spec, {"pid": os.getpid(), "start": None})
    assert second.events.get(timeout=5).phase == ReplicaPhase.FAILED


def test_a_replica_that_finished_meanwhile_is_reported_succeeded(two_lives):
    first, second = two_lives
    spec = _spec("worker", 2, FINISHES.format(s=0))
    first.launch(spec)
    identity = first.replica_identity("worker", 2)
    _until_terminal(first.events)
    assert not second.adopt(spec, identity)
    ev = second.events.get(timeout=5)
    assert ev.phase == ReplicaPhase.SUCCEEDED and ev.exit_code == 0


def test_replicas_of_an_owned_master_watch_the_owner(tmp_path, monkeypatch):
    monkeypatch.setenv(JOB_OWNER_ENV, str(os.getppid()))  # as the supervisor would set it
    p = _platform(tmp_path / "job")
    try:
        assert p.replicas_outlive_master
        p.launch(_spec("worker", 0, SLEEPS))
        env = _environ(p.replica_pid("worker", 0))
        owner = [e for e in env if e.startswith(b"ELASTICDL_EXIT_WITH_OWNER=")]
        assert owner and owner[0].split(b"=")[1].startswith(f"{os.getppid()}:".encode())
        assert not [e for e in env if e.startswith(b"ELASTICDL_EXIT_WITH_PARENT=")]
    finally:
        p.shutdown(delete_all=True, grace_seconds=2)
    monkeypatch.setenv(JOB_OWNER_ENV, "1")  # not this master's parent: no owner
    assert not _platform(tmp_path / "other").replicas_outlive_master


def test_reclaim_stops_a_replica_nobody_recorded(two_lives):
    first, second = two_lives
    first.launch(_spec("worker", 5, SLEEPS))
    first.launch(_spec("worker", 6, SLEEPS))
    pid = first.replica_pid("worker", 5)
    _environ(pid)  # running the new program
    assert second.reclaim("worker", 5) == 1
    ev, _ = _until_terminal(first.events)
    assert (ev.replica_id, ev.exit_code) == (5, 137)
    assert first.replica_pid("worker", 6) is not None  # only that replica's process
    assert second.reclaim("worker", 7) == 0
