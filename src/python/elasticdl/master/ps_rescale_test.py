import threading

import grpc
import pytest
from elasticdl.master.journal_ops import PSSetChanged
from elasticdl.master.ps_rescale import PSOps, PSRescaler, RescaleRefused
from elasticdl.master.servicer import MasterServicer
from elasticdl.master.task_manager import TaskManager, TaskManagerConfig
from elasticdl.master.tasks import TaskType
from elasticdl.proto import elasticdl_pb2 as pb


class FakePS:
    """The PS and replicas a change drives: records the calls in order."""

    def __init__(self, versions=None):
        self.versions = dict(versions or {})
        self.calls: list[tuple] = []
        self.fail_replace = False
        self.replaced = threading.Event()

    def save_shard(self, addr, as_version):
        self.calls.append(("save", addr, as_version))
        return as_version or self.versions.get(addr, 7)

    def wait_ready(self, addr, timeout):
        self.calls.append(("ready", addr))

    def replace_ps_set(self, num_ps, op):
        self.calls.append(("replace", num_ps, op))
        if self.fail_replace:
            raise RuntimeError("ps-1 cannot start")
        self.replaced.set()


def _addrs(n):
    return [f"ps-{i}:2222" for i in range(n)]


def _rescaler(tm, ps, num_ps=1, refuse=""):
    generations = []
    r = PSRescaler(
        tm,
        PSOps(ps.save_shard, ps.wait_ready, ps.replace_ps_set),
        addrs_of=_addrs,
        set_generation=lambda g, n: generations.append((g, n)),
        num_ps=num_ps,
        refuse_reason=refuse,
    )
    return r, generations


def _tm(tasks=10):
    return TaskManager(TaskManagerConfig(records_per_task=1), training_shards=[("f", 0, tasks)])


def test_a_change_waits_for_the_tasks_in_flight_then_swaps_and_stamps_new_tasks():
    tm, ps = _tm(), FakePS()
    r, generations = _rescaler(tm, ps)
    held = tm.get(0)
    assert held.type == TaskType.TRAINING
    change = r.request(2)
    # Dispatch is held: no task for anyone, and nothing done to the PS while one is in flight.
    assert tm.get(1).type == TaskType.WAIT
    assert [t.type for t in tm.lease(2, [], 4)] == [TaskType.WAIT]
    assert not ps.replaced.wait(0.3) and ps.calls == []
    tm.report(held.task_id, True, 0)  # the worker reports it: the change goes on
    assert r.wait(5)
    assert change.state == "done", change
    assert [c[0] for c in ps.calls] == ["save", "replace", "ready", "ready"]
    assert ps.calls[1] == ("replace", 2, PSSetChanged(1, 2, 7))
    assert generations == [(1, 2)]
    assert change.pause_s >= change.drain_s >= 0.3
    # Tasks flow again, each naming the new PS set.
    task = r.stamp(tm.get(1).to_pb())
    assert task.task_id and task.ps_generation == 1 and list(task.ps_addrs) == _addrs(2)
    # No task names a PS set before the first change (workers were started with it).
    assert r.status()["changes"][0]["state"] == "done" and r.status()["num_ps"] == 2


def test_the_first_ps_set_is_not_stamped():
    tm, ps = _tm(), FakePS()
    r, _ = _rescaler(tm, ps)
    task = r.stamp(tm.get(0).to_pb())
    assert task.ps_generation == 0 and not task.ps_addrs
    assert r.stamp(pb.Task()).ps_generation == 0  # WAIT / NONE carry nothing


def test_every_shard_is_written_at_one_version():
    tm = _tm()
    ps = FakePS({"ps-0:2222": 9, "ps-1:2222": 8})
    r, _ = _rescaler(tm, ps, num_ps=2)
    change = r.request(3)
    assert r.wait(5) and change.state == "done"
    saves = [c for c in ps.calls if c[0] == "save"]
    # The lagging PS is written again as the newest version.
    assert saves == [("save", "ps-0:2222", 0), ("save", "ps-1:2222", 0), ("save", "ps-1:2222", 9)]
    assert change.version == 9


@pytest.mark.parametrize(
    "num_ps,refuse,match",
    [
        (0, "", "num_ps must be >= 1"),
        (1, "", "runs 1 PS already"),
        (2, "submit it with --checkpoint_dir", "--checkpoint_dir"),
    ],
)
def test_bad_requests_are_refused_in_one_line(num_ps, refuse, match):
    tm, ps = _tm(), FakePS()
    r, _ = _rescaler(tm, ps, refuse=refuse)
    with pytest.raises(RescaleRefused, match=match):
        r.request(num_ps)
    assert not tm.held and ps.calls == []


def test_a_second_request_while_one_runs_is_refused():
    tm, ps = _tm(), FakePS()
    r, _ = _rescaler(tm, ps)
    held = tm.get(0)
    r.request(2)
    with pytest.raises(RescaleRefused, match="being changed to 2 already"):
        r.request(3)
    tm.report(held.task_id, True, 0)
    assert r.wait(5)


def test_a_job_that_ends_while_draining_keeps_its_ps():
    tm, ps = _tm(tasks=1), FakePS()
    r, _ = _rescaler(tm, ps)
    held = tm.get(0)
    change = r.request(2)
    tm.report(held.task_id, True, 0)  # the last task: the job has no work left
    assert r.wait(5)
    assert change.state == "failed" and "ended before" in change.error, change
    assert ps.calls == [] and not tm.held


def test_a_failed_swap_fails_the_job():
    """The old PS are gone and the new ones did not start: there is nothing to train with."""
    tm, ps = _tm(), FakePS()
    ps.fail_replace = True
    r, _ = _rescaler(tm, ps)
    change = r.request(2)
    assert r.wait(5)
    assert change.state == "failed" and "ps-1 cannot start" in change.error
    assert "changing the PS count to 2 failed" in tm.failed_message
    assert r.num_ps == 1 and r.generation == 0


def test_a_restarted_master_carries_on_with_the_journaled_ps_set():
    tm, ps = _tm(), FakePS()
    r, generations = _rescaler(tm, ps)
    r.restore(2, 3)
    assert generations == [(2, 3)] and r.num_ps == 3
    task = r.stamp(tm.get(0).to_pb())
    assert task.ps_generation == 2 and list(task.ps_addrs) == _addrs(3)


class _Aborted(Exception):
    pass


class _Context:
    def abort(self, code, details):
        self.code, self.details = code, details
        raise _Aborted()


def test_the_master_rpc_starts_a_change_refuses_in_one_line_and_stamps_leases():
    tm, ps = _tm(), FakePS()
    r, _ = _rescaler(tm, ps)
    ctx = _Context()
    with pytest.raises(_Aborted):
        MasterServicer(tm).scale_ps(pb.ScalePSRequest(num_ps=2), ctx)
    assert ctx.code == grpc.StatusCode.FAILED_PRECONDITION and "training jobs" in ctx.details
    servicer = MasterServicer(tm, ps_rescaler=r)
    with pytest.raises(_Aborted):
        servicer.scale_ps(pb.ScalePSRequest(num_ps=0), ctx)
    assert ctx.code == grpc.StatusCode.FAILED_PRECONDITION and "num_ps must be >= 1" in ctx.details
    answer = servicer.scale_ps(pb.ScalePSRequest(num_ps=2), ctx)
    assert answer.generation == 1 and "1 -> 2" in answer.message
    assert r.wait(5)
    lease = servicer.lease_tasks(pb.LeaseTasksRequest(worker_id=0, max_tasks=2), ctx)
    assert lease.tasks and all(
        t.ps_generation == 1 and list(t.ps_addrs) == _addrs(2) for t in lease.tasks
    )
    task = servicer.get_task(pb.GetTaskRequest(worker_id=1), ctx)
    assert task.ps_generation == 1


class _DyingPS(FakePS):
    """The master dies while the PS write the snapshot: the change never gets further."""

    def __init__(self):
        super().__init__()
        self.snapshotting, self.dead = threading.Event(), threading.Event()

    def save_shard(self, addr, as_version):
        self.snapshotting.set()
        self.dead.wait(5)
        raise RuntimeError("the master process is gone")


def test_a_master_killed_before_the_change_was_journaled_runs_the_old_set_and_asks_again():
    from elasticdl.master.journal import MemorySink

    tm, dying = _tm(), _DyingPS()
    sink = MemorySink()
    tm.attach_journal(sink)
    r, _ = _rescaler(tm, dying)
    r.request(2)
    assert dying.snapshotting.wait(5)  # drained (nothing in flight), snapshot under way
    assert ("replace", 2) not in [c[:2] for c in dying.calls]
    # The restarted master: tasks from the journal, and no PSSetChanged there, so no restore.
    new_tm, ps = _tm(), FakePS()
    new_tm.replay(None, sink.records)
    new_tm.resume_after_restart()
    new, generations = _rescaler(new_tm, ps)
    assert new.status() == {"num_ps": 1, "generation": 0, "changes": []}
    task = new_tm.get(0)
    assert not new_tm.held and task.task_id  # trains on with the old set
    dying.dead.set()
    assert r.wait(5)  # the dead master's thread, ended here: it is not part of the new one
    assert new_tm.report(task.task_id, True, 0)
    change = new.request(2)  # the change can be asked for again
    assert new.wait(5) and change.state == "done", change
    assert generations == [(1, 2)] and new.num_ps == 2
