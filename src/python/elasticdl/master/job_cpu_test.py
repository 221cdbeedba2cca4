"""The cores a job holds over a window: the pods' requests, or what the master and its
replica processes used (/proc)."""
import os
import time

import pytest
from elasticdl.master.job_cpu import (
    CPUReports,
    MeasuredCPU,
    ReportedCPU,
    RequestedCPU,
    cpu_seconds,
    requested_cores,
)


def test_requested_cores_read_the_cpu_of_a_request():
    assert requested_cores("cpu=250m,memory=1024Mi") == 0.25
    assert requested_cores("cpu=2") == 2.0
    assert requested_cores("memory=1024Mi") is None
    assert requested_cores("") is None


def test_requests_add_up_master_ps_and_workers():
    num_ps = [2]
    cpu = RequestedCPU.of("cpu=0.2", "cpu=0.5,memory=1Gi", "cpu=0.3", lambda: num_ps[0])
    assert cpu.source == "requests"
    assert abs(cpu.cores(cpu.mark(), 3) - (0.2 + 2 * 0.5 + 3 * 0.3)) < 1e-9
    num_ps[0] = 1  # elasticdl scale-ps
    assert abs(cpu.cores(None, 1) - 1.0) < 1e-9


def test_a_missing_cpu_request_makes_the_total_unknown():
    assert RequestedCPU.of("cpu=0.2", "cpu=0.2", "memory=1Gi", lambda: 1).cores(None, 2) is None
    assert RequestedCPU.of("", "cpu=0.2", "cpu=1", lambda: 1).cores(None, 2) is None
    assert RequestedCPU.of("cpu=0.2", "", "cpu=1", lambda: 0).cores(None, 2) == 2.2  # no PS


def test_measured_cores_are_the_cpu_seconds_of_the_window_over_its_length():
    clock, own = [100.0], [5.0]
    used = {11: 50.0, 12: 10.0, 13: 7.0}
    processes = {"ps-0": 11, "worker-0": 12}
    cpu = MeasuredCPU(lambda: dict(processes), lambda: clock[0], used.get, lambda: own[0])
    mark = cpu.mark()
    clock[0] += 10
    own[0] += 1.0  # the master
    used[11] += 2.0
    used[12] += 6.0
    processes["worker-1"] = 13  # started within the window: all its 7 s count
    assert cpu.source == "measured"
    assert abs(cpu.cores(mark, 2) - (1.0 + 2.0 + 6.0 + 7.0) / 10) < 1e-9


def test_a_relaunched_replica_counts_from_its_new_process():
    clock = [0.0]
    used = {21: 30.0, 22: 1.0}
    processes = {"worker-0": 21}
    cpu = MeasuredCPU(lambda: dict(processes), lambda: clock[0], used.get, lambda: 0.0)
    mark = cpu.mark()
    clock[0] = 4.0
    processes["worker-0"] = 22  # a new process under the same name: not 1 - 30 s
    assert abs(cpu.cores(mark, 1) - 1.0 / 4) < 1e-9
    assert cpu.cores(cpu.mark(), 1) is None  # no time has passed


def test_cpu_seconds_read_proc():
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    assert cpu_seconds(os.getpid()) > 0
    assert cpu_seconds(2**22 + 12345) is None  # above any pid_max: no such process


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _reported(clock, own, num_ps=1):
    reports = CPUReports(clock=clock)
    fallback = RequestedCPU(0.2, 0.2, 0.3, num_ps=lambda: num_ps)
    return reports, ReportedCPU(reports, lambda: num_ps, fallback, clock=clock, own=lambda: own[0])


def test_pods_cost_the_cpu_they_report_using():
    clock, own = Clock(), [1.0]
    reports, cpu = _reported(clock, own)
    reports.update("worker-0", 50.0)  # before the window: its baseline
    reports.update("ps-0", 10.0)
    clock.now = 1.0
    mark = cpu.mark()
    for t in range(2, 12):  # a worker at 0.3 cores, the PS at 0.05, the master at 0.01
        clock.now = float(t)
        reports.update("worker-0", 50.0 + 0.3 * t)
        reports.update("ps-0", 10.0 + 0.05 * t)
        own[0] += 0.01
    assert cpu.cores(mark, workers=1) == pytest.approx(0.3 + 0.05 + 0.01)
    assert cpu.source == "reported"


def test_a_replica_that_has_not_reported_across_the_window_falls_back_to_the_requests():
    clock, own = Clock(), [0.0]
    reports, cpu = _reported(clock, own)
    mark = cpu.mark()
    clock.now = 10.0
    reports.update("worker-0", 3.0)  # one reading: no rate yet; the PS none at all
    assert cpu.cores(mark, workers=1) == pytest.approx(0.2 + 0.2 + 0.3)
    assert cpu.source == "requests"


def test_a_worker_that_stopped_reporting_is_not_counted():
    clock, own = Clock(), [0.0]
    reports, cpu = _reported(clock, own)
    reports.update("worker-7", 1.0)  # released before the window
    clock.now = 5.0
    mark = cpu.mark()
    for t in (5.0, 15.0):
        clock.now = t
        reports.update("worker-0", t * 0.25)
        reports.update("ps-0", t * 0.1)
    assert cpu.cores(mark, workers=1) == pytest.approx(0.35)
    assert cpu.source == "reported"


def test_readings_are_kept_one_per_spacing_and_for_a_bounded_time():
    clock = Clock()
    reports = CPUReports(clock=clock, keep_s=60.0, spacing_s=0.5)
    cpu = 0.0
    for i in range(1, 10_001):  # a worker reporting 100 tasks a second for 100 s
        clock.now = i / 100
        cpu += (0.3 if clock.now <= 50 else 0.1) / 100  # 0.3 cores, then 0.1 from 50 s
        reports.update("worker-0", cpu)
    readings = reports._readings["worker-0"]
    # Kept readings are a spacing apart, less one report interval (the last report before it).
    assert 100 <= len(readings) <= 60 / 0.49 + 3, len(readings)
    assert readings[0][0] >= 100 - 60 - 0.5  # none older than keep_s
    kept = list(readings)[:-1]
    assert all(b[0] - a[0] >= 0.49 - 1e-9 for a, b in zip(kept, kept[1:]))
    assert readings[-1] == (100.0, pytest.approx(cpu))
    # The window's rate, not the average since the first report (0.2).
    assert reports.cores(since=90.0) == {"worker-0": pytest.approx(0.1, rel=0.02)}
