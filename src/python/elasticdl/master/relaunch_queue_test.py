import threading

from elasticdl.master.relaunch_queue import RelaunchQueue

# A safety net only: the events below are set within microseconds unless the queue is broken.
WAIT_S = 10


def test_one_replica_runs_in_order_one_at_a_time_beside_other_replicas():
    queue = RelaunchQueue()
    release, first_started, other_done = threading.Event(), threading.Event(), threading.Event()
    ran: list[str] = []
    running = []

    def step(name, before=None):
        def relaunch():
            running.append(name)
            assert len([r for r in running if r.startswith(name[:4])]) == 1  # never two at once
            if before is not None:
                before()
            ran.append(name)
            running.remove(name)

        return relaunch

    assert queue.submit("ps-0", step("ps-0 first", lambda: (first_started.set(), release.wait())))
    assert first_started.wait(WAIT_S)
    assert queue.submit("ps-0", step("ps-0 second"))
    # Another replica is not held up by ps-0's waiting relaunch.
    assert queue.submit("ps-1", step("ps-1", other_done.set))
    assert other_done.wait(WAIT_S)
    assert queue.busy("ps-0") and ran == ["ps-1"]
    release.set()
    assert queue.wait_idle(WAIT_S)
    assert ran == ["ps-1", "ps-0 first", "ps-0 second"] and not queue.busy("ps-0")


def test_closing_drops_what_has_not_begun_and_refuses_more():
    queue = RelaunchQueue()
    release, started = threading.Event(), threading.Event()
    ran: list[str] = []
    queue.submit("ps-0", lambda: (started.set(), release.wait(), ran.append("under way")))
    assert started.wait(WAIT_S)
    queue.submit("ps-0", lambda: ran.append("not begun"))
    queue.close()
    assert not queue.submit("ps-1", lambda: ran.append("after close"))
    release.set()
    assert queue.wait_idle(WAIT_S)
    assert ran == ["under way"]


def test_a_failed_relaunch_does_not_stop_the_next_one():
    queue = RelaunchQueue()
    ran: list[str] = []

    def broken():
        raise RuntimeError("cannot launch")

    queue.submit("ps-0", broken)
    queue.submit("ps-0", lambda: ran.append("next"))
    assert queue.wait_idle(WAIT_S)
    assert ran == ["next"]
