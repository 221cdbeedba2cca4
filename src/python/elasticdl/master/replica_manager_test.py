import os
import signal
import threading
import time

import pytest
from elasticdl.master.journal import MemorySink
from elasticdl.master.replica_manager import (
    PriorityError,
    ReplicaManager,
    ReplicaManagerConfig,
    parse_worker_priority,
)
from elasticdl.master.task_manager import TaskManager, TaskManagerConfig, TaskType
from elasticdl.platform.base import (
    REASON_DELETED_BY_MASTER,
    REASON_OOM_KILLED,
    LaunchSpec,
    Platform,
    PlatformError,
    ReplicaEvent,
    ReplicaPhase,
    ReplicaType,
)
from elasticdl.platform.local import LocalProcessPlatform

W, PS = ReplicaType.WORKER, ReplicaType.PS
# Only a safety net for waits on other threads: they end within milliseconds unless broken.
SAFETY_NET_S = 10


class FakePlatform(Platform):
    """Test-only fake: the platform's events (what a kubelet or the OS would report) are the
    external input of the replica manager, so the test injects them directly."""

    def __init__(self):
        super().__init__("fake")
        self.launched: list[LaunchSpec] = []
        self.deleted: list[tuple] = []
        self.closed = False

    @classmethod
    def from_spec(cls, spec):
        return cls()

    def launch(self, spec):
        self.launched.append(spec)
        self._emit(ReplicaEvent(spec.replica_type, spec.replica_id, ReplicaPhase.RUNNING))

    def delete(self, replica_type, replica_id, grace_seconds=10.0):
        self.deleted.append((replica_type, replica_id))
        self._emit(
            ReplicaEvent(
                replica_type, replica_id, ReplicaPhase.DELETED, 143, REASON_DELETED_BY_MASTER
            )
        )

    def address(self, replica_type, replica_id):
        return f"{replica_type}-{replica_id}:2222"

    def master_address(self, port):
        return f"master:{port}"

    def shutdown(self, delete_all=True):
        self.closed = True

    def end(self, replica_type, replica_id, phase, exit_code=None, reason=""):
        self._emit(ReplicaEvent(replica_type, replica_id, phase, exit_code, reason))

    def ids(self, replica_type):
        return [s.replica_id for s in self.launched if s.replica_type == replica_type]


def _spec(replica_type):
    return lambda i: LaunchSpec(
        replica_type, i, module=f"elasticdl.{replica_type}.main", args=[f"--id={i}"]
    )


def _manager(platform, num_workers=2, num_ps=1, records=100, **kw):
    tm = TaskManager(TaskManagerConfig(records_per_task=10), training_shards=[("d", 0, records)])
    rm = ReplicaManager(
        platform, ReplicaManagerConfig(num_ps, num_workers, **kw), _spec(W), _spec(PS), tm
    )
    rm.start()
    return rm, tm


def test_starts_ps_then_workers():
    p = FakePlatform()
    rm, _ = _manager(p, num_workers=3, num_ps=2)
    assert [(s.replica_type, s.replica_id) for s in p.launched] == [
        (PS, 0),
        (PS, 1),
        (W, 0),
        (W, 1),
        (W, 2),
    ]
    assert sorted(rm.alive_workers()) == [0, 1, 2]


def test_failed_worker_tasks_recovered_and_relaunched_with_new_id_until_budget():
    p = FakePlatform()
    rm, tm = _manager(p, num_workers=2, relaunch_on_worker_failure=1)
    t = tm.get(0)
    p.end(W, 0, ReplicaPhase.FAILED, 1, "Error")
    # Its task is back in the queue at once, and a new worker 2 replaces it.
    assert tm.get(1).task_id == t.task_id
    assert p.ids(W) == [0, 1, 2]
    # The replacement fails too: budget of 1 used up -> not relaunched.
    p.end(W, 2, ReplicaPhase.FAILED, 1, "Error")
    assert p.ids(W) == [0, 1, 2]
    states = {(s.replica_type, s.replica_id): s for s in rm.replicas()}
    assert states[(W, 0)].replaced_by == 2 and states[(W, 2)].relaunch_count == 1
    assert rm.failed_message == ""  # worker 1 is still alive
    p.end(W, 1, ReplicaPhase.FAILED, 2, "Error")  # budget per lineage: worker 1 gets a relaunch
    assert p.ids(W) == [0, 1, 2, 3]
    p.end(W, 3, ReplicaPhase.FAILED, 2, "Error")
    assert "no worker left" in rm.failed_message
    assert "no worker left" in tm.failed_message and tm.get(9).type == TaskType.NONE


def _complete_a_task(tm, worker_id):
    task = tm.get(worker_id)
    assert tm.report(task.task_id, True, worker_id)


def test_preemption_always_relaunches_but_oom_does_not():
    p = FakePlatform()
    rm, tm = _manager(p, num_workers=1, relaunch_on_worker_failure=0)
    for i in range(3):  # SIGKILL/SIGTERM / preemption: relaunched every time, budget untouched
        _complete_a_task(tm, i)
        p.end(W, i, ReplicaPhase.FAILED, 143 if i == 1 else 137)
    assert p.ids(W) == [0, 1, 2, 3]
    p.end(W, 3, ReplicaPhase.DELETED, None, "Preempted")
    assert p.ids(W) == [0, 1, 2, 3, 4]
    p.end(W, 4, ReplicaPhase.FAILED, 137, REASON_OOM_KILLED)
    assert p.ids(W) == [0, 1, 2, 3, 4]
    assert "no worker left" in rm.failed_message


def test_bare_sigkills_with_no_task_done_between_end_up_using_the_budget():
    # The container engine may report an out-of-memory kill as a bare 137: a worker killed at
    # every start must not be relaunched forever.
    p = FakePlatform()
    rm, tm = _manager(p, num_workers=1, relaunch_on_worker_failure=1)
    p.end(W, 0, ReplicaPhase.FAILED, 137)
    p.end(W, 1, ReplicaPhase.FAILED, 137)  # two bare kills in a row: still spared
    _complete_a_task(tm, 2)
    p.end(W, 2, ReplicaPhase.FAILED, 137)  # it worked: the count starts again (1)
    p.end(W, 3, ReplicaPhase.DELETED, None, "Preempted")  # named: always spared, not counted
    p.end(W, 4, ReplicaPhase.FAILED, 137)  # 2
    assert p.ids(W) == [0, 1, 2, 3, 4, 5]
    states = {s.replica_id: s for s in rm.replicas() if s.replica_type == W}
    assert all(states[i].relaunch_count == 0 for i in range(6))
    p.end(W, 5, ReplicaPhase.FAILED, 137)  # 3 without a task done: counts (budget 1 -> used)
    assert p.ids(W) == [0, 1, 2, 3, 4, 5, 6]
    assert {s.replica_id: s for s in rm.replicas()}[6].relaunch_count == 1
    p.end(W, 6, ReplicaPhase.FAILED, 137)
    assert p.ids(W) == [0, 1, 2, 3, 4, 5, 6] and "no worker left" in rm.failed_message


def test_disable_relaunch_and_success_needs_no_relaunch():
    p = FakePlatform()
    rm, tm = _manager(p, num_workers=2, disable_relaunch=True)
    p.end(W, 0, ReplicaPhase.FAILED, 137)
    assert p.ids(W) == [0, 1]
    while (t := tm.get(1)).type == TaskType.TRAINING:
        tm.report(t.task_id, True, 1)
    p.end(W, 1, ReplicaPhase.SUCCEEDED, 0)
    assert rm.all_workers_exited() and rm.failed_message == "" and tm.finished


def _end_ps_and_settle(rm, p, *end):
    p.end(PS, *end)
    assert rm.wait_relaunches(SAFETY_NET_S)  # the relaunch runs beside the event thread


def test_ps_relaunched_with_same_id_then_job_fails_after_limit():
    p = FakePlatform()
    rm, _ = _manager(p, num_workers=1, num_ps=2, max_ps_relaunches=2)
    _end_ps_and_settle(rm, p, 1, ReplicaPhase.FAILED, 137)  # preempted: not counted
    _end_ps_and_settle(rm, p, 1, ReplicaPhase.FAILED, 1, "Error")
    _end_ps_and_settle(rm, p, 1, ReplicaPhase.FAILED, 1, "Error")
    assert p.ids(PS) == [0, 1, 1, 1, 1]
    ps1 = [s for s in rm.replicas() if s.replica_type == PS and s.replica_id == 1][0]
    assert ps1.relaunch_count == 3 and ps1.phase == ReplicaPhase.RUNNING
    _end_ps_and_settle(rm, p, 1, ReplicaPhase.FAILED, 1, "Error")
    assert "PS 1 failed 3 times" in rm.failed_message
    assert p.ids(PS) == [0, 1, 1, 1, 1]


class SlowPSPlatform(FakePlatform):
    """A relaunched PS's launch waits until the test releases it, as a Kubernetes launch waits
    for the pod of a lost node (stuck Terminating) to go; shutting down ends the wait, as on
    Kubernetes."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()
        self.waiting = threading.Event()  # a PS launch is waiting
        self.adopted: list[tuple] = []
        self.reclaimed: list[tuple] = []

    def launch(self, spec):
        if spec.replica_type == PS and spec.replica_id in self.ids(PS):
            self.waiting.set()
            if not self.release.wait(SAFETY_NET_S):
                raise PlatformError("the test never released the PS launch")
            if self.closed:
                raise PlatformError("platform is shut down")
        super().launch(spec)

    def shutdown(self, delete_all=True):
        super().shutdown(delete_all)
        self.release.set()

    def adopt(self, spec, identity):
        self.adopted.append((spec.replica_type, spec.replica_id))
        self._emit(ReplicaEvent(spec.replica_type, spec.replica_id, ReplicaPhase.RUNNING))
        return True

    def reclaim(self, replica_type, replica_id):
        self.reclaimed.append((replica_type, replica_id))
        return 0


def _journaled_manager(p, **kw):
    tm = TaskManager(TaskManagerConfig(records_per_task=10), training_shards=[("d", 0, 100)])
    rm = ReplicaManager(p, ReplicaManagerConfig(1, 2, **kw), _spec(W), _spec(PS), tm)
    sink = MemorySink()
    rm.attach_journal(sink)
    return rm, tm, sink


def _journal(sink):
    """(operation, replica type, id) of each replica record; a PS failure count's ``n`` as id."""
    return [
        (r["o"], r.get("k"), r["n"] if r["o"] == "psf" else r["i"])
        for r in sink.records
        if r["o"] in ("launching", "launch", "end", "psf")
    ]


def test_a_waiting_ps_relaunch_holds_up_no_other_event_and_runs_once():
    p = SlowPSPlatform()
    rm, tm, sink = _journaled_manager(p)
    rm.start()
    # PS 0 fails; its relaunch waits (its old pod is going slowly) without holding up the
    # events: worker 0, killed meanwhile, is relaunched as worker 2 before the PS is back.
    p.end(PS, 0, ReplicaPhase.FAILED, 1, "Error")
    assert p.waiting.wait(SAFETY_NET_S)
    task = tm.get(0)
    p.end(W, 0, ReplicaPhase.FAILED, 137)
    assert p.ids(W) == [0, 1, 2] and tm.get(2).task_id == task.task_id
    # The PS's end again, and late: acted on once (one relaunch, one failure counted).
    p.end(PS, 0, ReplicaPhase.FAILED, 1, "Error")
    p.end(PS, 0, ReplicaPhase.DELETED, None, "Deleted")
    assert p.ids(PS) == [0] and not p.release.is_set()
    p.release.set()
    assert rm.wait_relaunches(SAFETY_NET_S)
    assert p.ids(PS) == [0, 0] and rm.failed_message == ""
    ps0 = [s for s in rm.replicas() if s.replica_type == PS][0]
    assert (ps0.phase, ps0.relaunch_count) == (ReplicaPhase.RUNNING, 1)
    # The journal: the PS's relaunch announced before the wait, recorded launched after it,
    # worker 2's launch in between.
    assert _journal(sink)[-8:] == [
        ("end", "ps", 0),
        ("psf", None, 1),
        ("launching", "ps", 0),
        ("end", "worker", 0),
        ("end", "worker", 0),  # with its replacement's id
        ("launching", "worker", 2),
        ("launch", "worker", 2),
        ("launch", "ps", 0),
    ]
    # Its new life's end is acted on as usual.
    _end_ps_and_settle(rm, p, 0, ReplicaPhase.FAILED, 137)
    assert p.ids(PS) == [0, 0, 0]


def test_the_job_ending_while_a_ps_relaunch_waits_launches_nothing_more():
    p = SlowPSPlatform()
    rm, _, sink = _journaled_manager(p)
    rm.start()
    p.end(PS, 0, ReplicaPhase.FAILED, 1, "Error")
    assert p.waiting.wait(SAFETY_NET_S)
    rm.stop()  # shuts the platform down, which ends the PS launch's wait
    assert rm.wait_relaunches(SAFETY_NET_S)
    assert p.ids(PS) == [0] and p.closed
    assert rm.failed_message == ""  # the job's end is no failure to launch
    assert _journal(sink)[-1] == ("launching", "ps", 0)  # announced, never launched


def test_a_master_restarted_during_a_ps_relaunch_relaunches_it_once():
    first = SlowPSPlatform()
    rm, _, sink = _journaled_manager(first)
    rm.start()
    first.end(PS, 0, ReplicaPhase.FAILED, 1, "Error")
    assert first.waiting.wait(SAFETY_NET_S)
    records = list(sink.records)  # the master dies here: the relaunch announced, not done
    assert _journal(sink)[-1] == ("launching", "ps", 0)
    first.release.set()
    assert rm.wait_relaunches(SAFETY_NET_S)

    second = SlowPSPlatform()
    second.release.set()
    rm, _, _ = _journaled_manager(second, max_ps_relaunches=1)
    rm.restore(records)
    rm.adopt()
    assert rm.wait_relaunches(SAFETY_NET_S)
    # What the dead master may have started unrecorded is stopped; the PS is launched once,
    # its failure counted once (a limit of 1 is not exceeded); the workers are adopted.
    assert (PS, 0) in second.reclaimed and second.ids(PS) == [0]
    assert sorted(second.adopted) == [(W, 0), (W, 1)] and rm.failed_message == ""
    ps0 = [s for s in rm.replicas() if s.replica_type == PS][0]
    assert (ps0.phase, ps0.relaunch_count) == (ReplicaPhase.RUNNING, 1)


def test_timeout_deletes_and_relaunches_worker_and_stop_ends_relaunching():
    p = FakePlatform()
    rm, _ = _manager(p, num_workers=1, relaunch_timeout_worker=True)
    rm.on_worker_timeout(0)
    assert p.deleted == [(W, 0)] and p.ids(W) == [0, 1]
    rm.stop()
    p.end(W, 1, ReplicaPhase.FAILED, 137)
    assert p.ids(W) == [0, 1] and p.closed


def test_worker_priority_fraction():
    # The original's rule: ceil(fraction * workers) high, picked from both ends in turn.
    assert parse_worker_priority(4, "0.5") == {0: "high", 1: "low", 2: "low", 3: "high"}
    assert parse_worker_priority(5, "0.5") == {0: "high", 1: "high", 2: "low", 3: "low", 4: "high"}
    assert parse_worker_priority(3, "0.1") == {0: "high", 1: "low", 2: "low"}
    assert parse_worker_priority(3, "0") == {0: "low", 1: "low", 2: "low"}
    assert parse_worker_priority(3, "1.0") == {0: "high", 1: "high", 2: "high"}
    assert parse_worker_priority(2, "low") == {0: "low", 1: "low"}
    assert parse_worker_priority(2, "") == {0: "", 1: ""}
    for bad in ("urgent", "1.5", "-0.1"):
        with pytest.raises(PriorityError, match="--worker_pod_priority"):
            parse_worker_priority(2, bad)


# ---- with real child processes ------------------------------------------------------------
class InlineSpec(LaunchSpec):
    """Runs inline code (`python -c`) instead of an ElasticDL module."""

    def command(self, python="python"):
        return [python, "-c", self.args[0]]


def _wait(pred, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def test_local_processes_sigkill_relaunch_and_budget(tmp_path):
    # worker 0 sleeps (the test SIGKILLs it: preemption -> relaunched as worker 2, which exits
    # 0); worker 1 exits 3 once worker 2 exists -> relaunched once as worker 3, which exits 3 ->
    # budget used. (Worker 1 waits for a flag file: new ids follow the order the deaths are
    # seen, and an immediate exit sometimes beat the kill of worker 0.)
    flag = tmp_path / "worker-2-launched"
    programs = {
        0: "import time; time.sleep(60)",
        1: (
            f"import os, sys, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.01)\n"
            "sys.exit(3)"
        ),
        2: "pass",
        3: "import sys; print('still failing'); sys.exit(3)",
    }
    platform = LocalProcessPlatform("rm", tmp_path)
    tm = TaskManager(TaskManagerConfig(records_per_task=10), training_shards=[("d", 0, 100)])
    rm = ReplicaManager(
        platform,
        ReplicaManagerConfig(num_ps=1, num_workers=2, relaunch_on_worker_failure=1),
        worker_spec=lambda i: InlineSpec(W, i, "", [programs[i]]),
        ps_spec=lambda i: InlineSpec(PS, i, "", ["import time; time.sleep(60)"], port=0),
        task_manager=tm,
    )
    try:
        rm.start()
        _wait(lambda: platform.replica_pid(W, 0) is not None)
        task = tm.get(0)
        os.kill(platform.replica_pid(W, 0), signal.SIGKILL)
        _wait(lambda: 2 in {s.replica_id for s in rm.replicas() if s.replica_type == W})
        flag.touch()  # now worker 1 fails
        _wait(lambda: {2, 3} <= {s.replica_id for s in rm.replicas() if s.replica_type == W})
        _wait(lambda: rm.all_workers_exited())
        states = {(s.replica_type, s.replica_id): s for s in rm.replicas()}
        assert (states[(W, 0)].exit_code, states[(W, 0)].replaced_by) == (137, 2)
        assert states[(W, 2)].phase == ReplicaPhase.SUCCEEDED
        assert (states[(W, 1)].exit_code, states[(W, 1)].replaced_by) == (3, 3)
        assert (states[(W, 3)].phase, states[(W, 3)].replaced_by) == (ReplicaPhase.FAILED, None)
        assert "still failing" in open(states[(W, 3)].log).read()
        assert tm.summary().tasks_recovered == 1  # the killed worker's task went back
        assert "no worker left" in rm.failed_message
        assert tm.get(5).type == TaskType.NONE and task.task_id == 1
        # The PS is still up; killing it brings it back under the same id.
        ps_pid = platform.replica_pid(PS, 0)
        os.kill(ps_pid, signal.SIGKILL)
        _wait(lambda: platform.replica_pid(PS, 0) not in (None, ps_pid))
    finally:
        rm.stop()
    assert platform.replica_pid(PS, 0) is None


# ---- --num_workers=auto ----------------------------------------------------------------------
def test_an_added_worker_gets_a_new_id_and_a_released_one_is_never_relaunched():
    p = FakePlatform()
    rm, tm = _manager(p, num_workers=1, max_workers=4)
    assert rm.add_worker() == 1 and p.ids(W) == [0, 1]
    task = tm.get(1)
    assert task.type == TaskType.TRAINING
    rm.release_worker(1, "released (--num_workers=auto)")
    assert tm.get(1).type == TaskType.NONE  # no more tasks: it reports what it holds, exits
    assert tm.report(task.task_id, True, 1)
    p.end(W, 1, ReplicaPhase.FAILED, 137)  # even a preemption does not bring it back
    assert p.ids(W) == [0, 1] and rm.alive_workers() == [0]


def test_a_worker_released_before_it_runs_is_deleted():
    p = FakePlatform()
    p.launch = lambda spec: p.launched.append(spec)  # stays Pending (no room on the cluster)
    rm, tm = _manager(p, num_workers=1, max_workers=4)
    worker = rm.add_worker()
    assert rm.worker_phase(worker) == "Pending"
    rm.release_worker(worker, "not added (--num_workers=auto)")
    assert p.deleted == [(W, worker)]
    assert p.ids(W) == [0, worker]  # not relaunched


def test_eviction_and_preemption_from_events_keep_the_budget_and_say_so():
    p = FakePlatform()
    rm, tm = _manager(p, num_workers=1, relaunch_on_worker_failure=0)
    task = tm.get(0)
    # The taint manager evicted it from a lost node (reason read from the pod's Events).
    p.end(W, 0, ReplicaPhase.DELETED, None, "Evicted")
    assert p.ids(W) == [0, 1] and tm.get(1).task_id == task.task_id  # re-queued at once
    p.end(W, 1, ReplicaPhase.DELETED, None, "Preempted")
    p.end(W, 2, ReplicaPhase.FAILED, None, "NodeLost")
    assert p.ids(W) == [0, 1, 2, 3]
    states = {s.replica_id: s for s in rm.replicas() if s.replica_type == W}
    assert [states[i].ended_by for i in range(4)] == ["evicted", "preempted", "evicted", ""]
    assert all(s.relaunch_count == 0 for s in states.values())
    # Anything else deleting it uses the budget (0 here): not relaunched.
    p.end(W, 3, ReplicaPhase.DELETED, None, "Deleted")
    assert p.ids(W) == [0, 1, 2, 3] and "no worker left" in rm.failed_message


def test_a_pending_workers_reason_is_kept_until_it_runs():
    p = FakePlatform()
    rm, _ = _manager(p, num_workers=1)
    why = "0/2 nodes are available: 2 Insufficient cpu."
    p._emit(ReplicaEvent(W, 0, ReplicaPhase.PENDING, reason="Unschedulable", message=why))
    (w0,) = [s for s in rm.replicas() if s.replica_type == W]
    assert (w0.phase, w0.waiting_reason, w0.waiting_message) == ("Pending", "Unschedulable", why)
    p._emit(ReplicaEvent(W, 0, ReplicaPhase.RUNNING))
    (w0,) = [s for s in rm.replicas() if s.replica_type == W]
    assert (w0.phase, w0.waiting_reason, w0.waiting_message) == ("Running", "", "")
