"""Rendezvous membership rules: ranks, world size, generations only after every member answered,
joins and leaves (platform events included). Pure logic with a manual clock."""

# Imported here only so the build knows the subprocess below needs them (none loads torch).
import elasticdl.client.main  # noqa: F401
import elasticdl.master.job  # noqa: F401
import elasticdl.ps.main  # noqa: F401
from elasticdl.master.rendezvous import Rendezvous, RendezvousConfig, generation_base
from elasticdl.platform.base import ReplicaEvent, ReplicaPhase, ReplicaType


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _rdzv(settle=1.0, answer_timeout=300.0):
    clock = Clock()
    r = Rendezvous(
        RendezvousConfig("10.0.0.1", 1234, settle_s=settle, answer_timeout_s=answer_timeout), clock
    )
    return r, clock


def test_first_generation_after_settle_with_ranks_in_join_order():
    r, clock = _rdzv()
    assert r.get_comm_rank(0).rendezvous_id == 0
    r.join(1, "h1")
    clock.now += 0.5
    r.join(0, "h0")
    clock.now += 0.9  # 0.9 s since the last join: not settled
    assert r.get_comm_rank(0).rank == -1 and r.generation == 0
    clock.now += 0.2
    c1, c0 = r.get_comm_rank(1), r.get_comm_rank(0)
    assert (c1.rank, c0.rank) == (0, 1)  # joining order, not worker id
    assert c1.world_size == c0.world_size == 2
    assert c1.rendezvous_id == 1
    assert (c1.store_host, c1.store_port) == ("10.0.0.1", 1234)
    assert r.get_comm_rank(7).rank == -1  # not a member


def test_a_restarted_master_numbers_its_generations_above_every_earlier_masters():
    """Workers that outlived a master hold a generation of it: the next master's first
    generation id must be newer than any, or they would wait for a newer one forever."""
    clock = Clock()
    first = generation_base(1)
    r = Rendezvous(RendezvousConfig("h", 1, first_generation=first), clock)
    assert r.get_comm_rank(0).rendezvous_id == first > 2**31  # above a long first life's ids
    r.join(0, "h0")
    clock.now += 1.1
    assert (r.get_comm_rank(0).rank, r.generation) == (0, first + 1)
    assert generation_base(0) == 0 and generation_base(2) > first + 2**31


def test_new_generation_only_after_all_members_acknowledged():
    r, clock = _rdzv(settle=0.0)
    r.join(0)
    r.join(1)
    assert r.generation == 1 and r.members() == [0, 1]
    r.join(2)  # a newcomer while generation 1 is still being built
    assert r.generation == 1  # nobody acknowledged 1 yet
    r.acknowledge(0, 1)
    assert r.generation == 1  # worker 1 has not
    r.acknowledge(1, 0)  # stale acknowledgement (wrong generation) does not count
    assert r.generation == 1
    r.acknowledge(1, 1)
    assert r.generation == 2 and r.members() == [0, 1, 2]
    assert r.get_comm_rank(2).rank == 2 and r.get_comm_rank(2).world_size == 3
    # No change: the generation stays even when everyone acknowledges.
    for w in (0, 1, 2):
        r.acknowledge(w, 2)
    assert r.generation == 2


def test_leave_removes_member_and_survivors_keep_their_order():
    r, clock = _rdzv(settle=0.0)
    for w in (0, 1, 2):
        r.join(w)
    assert r.generation == 1
    for w in (0, 1, 2):
        r.acknowledge(w, 1)
    r.leave(0, "exited")
    assert r.generation == 2 and r.members() == [1, 2]
    assert r.get_comm_rank(1).rank == 0  # the longest-serving survivor broadcasts
    # A departed worker cannot come back under the same id (a relaunch gets a new id).
    r.join(0)
    r.acknowledge(1, 2)
    r.acknowledge(2, 2)
    assert r.members() == [1, 2]
    r.join(3)
    assert r.generation == 3 and r.members() == [1, 2, 3]


def test_dead_member_is_not_waited_for():
    r, clock = _rdzv(settle=0.0)
    r.join(0)
    r.join(1)
    assert r.generation == 1
    r.acknowledge(0, 1)  # worker 1 died before acknowledging
    r.on_replica_event(ReplicaEvent(ReplicaType.WORKER, 1, ReplicaPhase.FAILED, exit_code=137))
    assert r.generation == 2 and r.members() == [0]
    # PS events are not the rendezvous' business.
    r.on_replica_event(ReplicaEvent(ReplicaType.PS, 0, ReplicaPhase.FAILED, exit_code=1))
    assert r.members() == [0]


def test_survivors_are_told_while_a_member_of_their_generation_is_gone():
    """The survivors still wait in a collective (they have not answered), so no generation can
    form yet: get_comm_rank tells them the one they are in cannot complete."""
    r, clock = _rdzv(settle=0.0)
    for w in (0, 1, 2):
        r.join(w)
    for w in (0, 1, 2):
        r.acknowledge(w, 1)
    assert not r.get_comm_rank(0).members_gone
    r.on_replica_event(ReplicaEvent(ReplicaType.WORKER, 2, ReplicaPhase.DELETED, reason="NodeLost"))
    answer = r.get_comm_rank(0)
    assert answer.members_gone and answer.rendezvous_id == 1  # 0 and 1 have not answered
    r.join(0)  # its collective ended on that word
    r.join(1)
    answer = r.get_comm_rank(0)
    assert answer.rendezvous_id == 2 and not answer.members_gone and r.members() == [0, 1]


def test_member_rejoin_after_collective_failure_forms_new_generation():
    r, clock = _rdzv(settle=1.0)
    r.join(0)
    r.join(1)
    clock.now += 1
    assert r.generation == 1
    r.acknowledge(0, 1)
    r.acknowledge(1, 1)
    clock.now += 50
    r.join(1)  # its allreduce failed: it answers generation 1 and asks for a new one
    assert r.generation == 1  # settling (maybe a crash is about to be reported)
    clock.now += 1
    assert r.generation == 2 and r.members() == [0, 1]


def test_unanswering_member_waited_for_at_most_the_timeout():
    r, clock = _rdzv(settle=0.0, answer_timeout=30.0)
    r.join(0)
    r.join(1)
    assert r.generation == 1
    r.acknowledge(0, 1)  # worker 1 hangs
    r.join(2)
    clock.now += 29
    assert r.generation == 1
    clock.now += 2
    assert r.generation == 2 and r.members() == [0, 1, 2]


def test_parameter_server_path_never_imports_torch():
    """torch is for AllReduce jobs only: the PS, the master's PS path and the rendezvous module
    itself must not load it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import elasticdl.ps.main, elasticdl.master.job, elasticdl.master.servicer\n"
        "import elasticdl.master.rendezvous, elasticdl.client.main\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    from elasticdl.platform.local import child_pythonpath

    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": child_pythonpath(), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
