"""LocalProcessPlatform with real child processes (small `python -c` programs)."""

import os
import queue
import signal
import time

import pytest
from elasticdl.platform.base import (
    REASON_DELETED_BY_MASTER,
    LaunchSpec,
    PlatformError,
    ReplicaPhase,
    ReplicaType,
)
from elasticdl.platform.local import LocalProcessPlatform, exit_code_of


class InlineSpec(LaunchSpec):
    """Real replicas run `python -m <module>`; these test programs are inline `python -c` code."""

    def command(self, python="python"):
        return [python, "-c", self.args[0]]


def _spec(replica_type, replica_id, code, port=None):
    return InlineSpec(replica_type, replica_id, module="", args=[code], port=port)


@pytest.fixture
def platform(tmp_path):
    p = LocalProcessPlatform("unit", tmp_path / "job")
    events = queue.Queue()
    p.add_event_listener(events.put)
    p.events = events
    yield p
    p.shutdown(delete_all=True, grace_seconds=2)


def _until_terminal(events, timeout=20):
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ev = events.get(timeout=max(0.01, deadline - time.monotonic()))
        seen.append(ev)
        if ev.phase.is_terminal:
            return ev, seen
    raise AssertionError(f"no terminal event, saw {seen}")


def test_exit_codes_and_logs(platform):
    platform.launch(_spec("worker", 0, "import sys; print('hello from worker'); sys.exit(0)"))
    ev, seen = _until_terminal(platform.events)
    assert [e.phase for e in seen] == [
        ReplicaPhase.PENDING,
        ReplicaPhase.RUNNING,
        ReplicaPhase.SUCCEEDED,
    ]
    assert ev.exit_code == 0 and ev.replica_type is ReplicaType.WORKER
    log = platform.log_path("worker", 0).read_text()
    assert "hello from worker" in log

    platform.launch(_spec("worker", 1, "import sys; print('boom'); sys.exit(3)"))
    ev, _ = _until_terminal(platform.events)
    assert (ev.phase, ev.exit_code, ev.replica_id) == (ReplicaPhase.FAILED, 3, 1)
    assert "boom" in ev.message
    assert not ev.looks_preempted


def test_sigkill_from_outside_is_137_and_preemption(platform):
    platform.launch(_spec("worker", 2, "import time; time.sleep(60)"))
    deadline = time.monotonic() + 10
    while platform.replica_pid("worker", 2) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(platform.replica_pid("worker", 2), signal.SIGKILL)
    ev, _ = _until_terminal(platform.events)
    assert (ev.phase, ev.exit_code, ev.reason) == (ReplicaPhase.FAILED, 137, "SIGKILL")
    assert ev.looks_preempted


def test_delete_reports_deleted_and_kills_group(platform):
    # The replica spawns a grandchild; deleting the replica must stop both.
    code = (
        "import subprocess, sys, time;"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
        "print(p.pid, flush=True); time.sleep(60)"
    )
    platform.launch(_spec("ps", 0, code, port=12345))
    log = platform.log_path("ps", 0)
    deadline = time.monotonic() + 15
    grandchild = None
    while time.monotonic() < deadline:
        lines = [l for l in log.read_text().splitlines() if l.strip().isdigit()]
        if lines:
            grandchild = int(lines[0])
            break
        time.sleep(0.05)
    assert grandchild is not None
    with pytest.raises(PlatformError):
        platform.launch(_spec("ps", 0, "pass"))
    platform.delete("ps", 0, grace_seconds=2)
    ev, _ = _until_terminal(platform.events)
    assert ev.phase is ReplicaPhase.DELETED and ev.reason == REASON_DELETED_BY_MASTER
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("grandchild survived delete")
    # The PS keeps its address across relaunches (workers find it again).
    assert platform.address("ps", 0) == "127.0.0.1:12345"
    platform.launch(_spec("ps", 0, "pass", port=12345))
    ev, _ = _until_terminal(platform.events)
    assert ev.phase is ReplicaPhase.SUCCEEDED
    assert log.read_text().count("===== ") == 2  # relaunch appended to the same log


def test_addresses_are_stable_and_distinct(platform):
    a = platform.address("ps", 0)
    assert platform.address("ps", 0) == a
    assert platform.address("ps", 1) != a
    assert platform.master_address(50001) == "127.0.0.1:50001"


def test_children_import_the_masters_code(platform):
    platform.launch(
        _spec(
            "worker",
            5,
            "import elasticdl.platform.base as b, sys; sys.exit(7 if b.EXIT_CODE_KILLED == 137 else 1)",
        )
    )
    ev, _ = _until_terminal(platform.events)
    assert ev.exit_code == 7, ev.message


def test_shutdown_stops_everything(tmp_path):
    p = LocalProcessPlatform("unit", tmp_path)
    events = queue.Queue()
    p.add_event_listener(events.put)
    p.launch(_spec("worker", 0, "import time; time.sleep(60)"))
    ready = tmp_path / "ready"
    p.launch(
        _spec(
            "worker",
            1,
            "import pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)",
        )
    )
    # Wait until the child really ignores SIGTERM (Python starts slowly on a loaded machine).
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists()
    p.shutdown(delete_all=True, grace_seconds=1)
    phases = {}
    while not events.empty():
        e = events.get()
        phases[e.replica_id] = (e.phase, e.exit_code)
    assert phases[0] == (ReplicaPhase.DELETED, 143)
    # Ignored SIGTERM -> SIGKILL after the grace (a child left to end its sleep would exit 0).
    assert phases[1] == (ReplicaPhase.DELETED, 137)
    with pytest.raises(PlatformError):
        p.launch(_spec("worker", 2, "pass"))


def test_exit_code_of():
    assert exit_code_of(-9) == 137 and exit_code_of(-15) == 143 and exit_code_of(2) == 2
