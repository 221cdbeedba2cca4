import pytest
from elasticdl.master.throughput import Throughput


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _train(meter: Throughput, clock: _Clock, trained: int, workers: int, seconds: int) -> int:
    """``workers`` workers at 100 records/s each for ``seconds``, observed every 2 s."""
    for _ in range(seconds // 2):
        clock.now += 2
        trained += workers * 100 * 2
        meter.observe(trained)
    return trained


def test_the_eta_follows_the_workers_that_train_now():
    clock = _Clock()
    meter = Throughput(window_s=30, clock=clock)
    meter.observe(0)
    assert meter.records_per_second() is None  # nothing measured yet
    trained = _train(meter, clock, 0, workers=4, seconds=120)
    assert meter.records_per_second() == pytest.approx(400)
    assert meter.eta_seconds(40_000) == pytest.approx(100)

    # Two workers preempted: within one window the speed halves and the ETA doubles (the
    # job's average, 400 records/s for 2 minutes, would still say 100 s).
    trained = _train(meter, clock, trained, workers=2, seconds=30)
    assert meter.records_per_second() == pytest.approx(200)
    assert meter.eta_seconds(40_000) == pytest.approx(200)

    # Every worker Pending: no progress over the window is no speed, no ETA.
    trained = _train(meter, clock, trained, workers=0, seconds=30)
    assert meter.records_per_second() == 0 and meter.eta_seconds(40_000) is None

    # They come back, and more: 6 workers.
    trained = _train(meter, clock, trained, workers=6, seconds=30)
    assert meter.records_per_second() == pytest.approx(600)
    assert meter.eta_seconds(0) == 0.0


def test_half_a_window_after_a_change_is_between_the_two_speeds():
    clock = _Clock()
    meter = Throughput(window_s=30, clock=clock)
    meter.observe(0)
    trained = _train(meter, clock, 0, workers=4, seconds=60)
    _train(meter, clock, trained, workers=2, seconds=16)
    assert 200 < meter.records_per_second() < 400
