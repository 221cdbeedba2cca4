"""The PS's model lock counts how long requests queue for it and hold it (outermost holder
only), and the meter turns the totals into a window's figures."""
import threading

from elasticdl.ps.load_meter import LoadMeter, MeteredLock
from elasticdl.ps.optimizer import Optimizer, parse_optimizer_config
from elasticdl.ps.parameters import Parameters
from elasticdl.ps.updater import ParameterServer


def test_waits_and_holds_of_the_outermost_holder_are_counted():
    lock = MeteredLock()
    meter = LoadMeter(lock, cpus=1)
    held = threading.Event()
    release = threading.Event()

    def holder():
        with lock:
            with lock:  # re-entered: still one acquisition
                held.set()
                release.wait(60)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(60)
    waiter_done = threading.Event()

    def waiter():
        with lock:
            waiter_done.set()

    w = threading.Thread(target=waiter)
    w.start()
    release.set()
    t.join(60)
    w.join(60)
    assert waiter_done.is_set()
    assert lock.acquisitions == 2
    assert lock.wait_s > 0 and lock.held_s > 0
    load = meter.window()
    assert load.requests == 2 and load.lock_wait_ms > 0
    assert 0 < load.lock_busy_fraction <= 1
    assert meter.window().requests == 0  # the next window starts empty


def test_the_parameter_servers_lock_is_metered():
    ps = ParameterServer(Parameters(0, 1), Optimizer(parse_optimizer_config("SGD", "")))
    before = ps.lock.acquisitions
    ps.pull_dense(-1)
    assert ps.lock.acquisitions == before + 1
