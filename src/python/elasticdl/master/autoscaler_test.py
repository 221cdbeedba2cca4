"""--num_workers=auto's decisions against a job whose throughput is a known function of its
workers (simulated on a clock of its own): add while it pays, release the worker that did
not, hold at the maximum or on a saturated PS, a worker that never runs counts as not added,
and a restarted master carries on from the journaled decisions."""
from elasticdl.common.types import Shard
from elasticdl.master.autoscaler import (
    ADD,
    HOLD,
    NOT_ADDED,
    RELEASE,
    Autoscaler,
    AutoscalerConfig,
    PSLoads,
)
from elasticdl.master.journal_ops import ScalingDecided
from elasticdl.master.tasks import Task, TaskType
from elasticdl.platform.base import ReplicaPhase

RECORDS = 100  # per task
WARM_UP_S = 3  # a new worker's first task


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Workers:
    """The replica manager's side: workers start Running (or ``new_phase``)."""

    def __init__(self, clock, count, new_phase=ReplicaPhase.RUNNING):
        self.clock = clock
        self.started = {w: 0.0 for w in range(count)}
        self.phases = {w: ReplicaPhase.RUNNING for w in range(count)}
        self.new_phase = new_phase
        self.released: list[int] = []
        self.ops: list[ScalingDecided] = []

    def alive_workers(self):
        return [w for w, p in self.phases.items() if not p.is_terminal]

    def worker_phase(self, worker_id):
        return str(self.phases.get(worker_id, ""))

    def add_worker(self):
        worker = max(self.phases) + 1
        self.phases[worker] = self.new_phase
        self.started[worker] = self.clock.now
        return worker

    def release_worker(self, worker_id, reason):
        self.released.append(worker_id)
        self.phases[worker_id] = ReplicaPhase.SUCCEEDED

    def record_scaling(self, op):
        self.ops.append(op)


class Tasks:
    has_training = True
    training_finished = False
    finished = False

    def add_done_listener(self, listener):
        self.listener = listener


class Job:
    """Workers train at ``rate(k)`` records/s together, k = the running warm workers."""

    def __init__(self, rate, count=1, ps_busy=0.2, new_phase=ReplicaPhase.RUNNING, **config):
        self.clock = Clock()
        self.rate = rate
        self.workers = Workers(self.clock, count, new_phase)
        self.tasks = Tasks()
        self.loads = PSLoads(self.clock)
        self.ps_busy = ps_busy
        config = {"min_workers": count, "max_workers": 8, "window_s": 10.0, **config}
        self.scaler = Autoscaler(
            AutoscalerConfig(**config),
            self.workers,
            self.tasks,
            self.loads,
            clock=self.clock,
            wall_clock=self.clock,
        )
        self.owed = {}

    def run(self, seconds):
        for _ in range(int(seconds)):
            self.clock.now += 1
            running = [
                w
                for w in self.workers.alive_workers()
                if self.workers.phases[w] == ReplicaPhase.RUNNING
            ]
            warm = [w for w in running if self.clock.now - self.workers.started[w] >= WARM_UP_S]
            for w in running:
                if w not in warm:
                    continue
                self.owed[w] = self.owed.get(w, 0.0) + self.rate(len(warm)) / len(warm)
                while self.owed[w] >= RECORDS:
                    self.owed[w] -= RECORDS
                    task = Task(1, TaskType.TRAINING, Shard("f", 0, RECORDS), epoch=1)
                    self.tasks.listener(task, True, w)
            self.loads.update(
                0,
                {"cpu_fraction": 0.3, "lock_busy_fraction": self.ps_busy, "lock_wait_ms": 0.1},
            )
            self.scaler.tick()

    def actions(self):
        return [(d["action"], d["workers"]) for d in self.scaler.decisions]


def test_workers_are_added_while_they_pay_and_the_one_that_did_not_is_released():
    job = Job(lambda k: 400.0 * min(k, 3))  # three workers saturate the job
    job.run(300)
    assert job.actions() == [(ADD, 2), (ADD, 3), (ADD, 4), (RELEASE, 3)]
    release = job.scaler.decisions[-1]
    assert release["worker"] == 3 and job.workers.released == [3]
    assert release["gain"] < 0.1 and release["records_per_s"] > 0
    assert "released" in release["reason"] and "records/s with 4 workers" in release["reason"]
    assert job.scaler.status()["settled"] and job.scaler.target == 3
    assert [op.decision for op in job.workers.ops] == job.scaler.decisions  # journaled
    first = job.scaler.decisions[0]
    assert first["measured_workers"] == 1 and first["gain"] is None
    assert 350 <= first["records_per_s"] <= 450  # 400 records/s measured with one worker


def test_the_job_holds_at_max_workers():
    job = Job(lambda k: 100.0 * k, max_workers=3)
    job.run(200)
    assert job.actions() == [(ADD, 2), (ADD, 3), (HOLD, 3)]
    assert "--max_workers" in job.scaler.decisions[-1]["reason"]


def test_a_saturated_ps_stops_the_growth():
    job = Job(lambda k: 100.0 * k, ps_busy=0.95)
    job.run(100)
    assert job.actions() == [(HOLD, 1)]
    decision = job.scaler.decisions[0]
    assert decision["ps"]["lock_busy"] == 0.95
    assert "saturated" in decision["reason"]


def test_a_worker_that_never_runs_counts_as_not_added():
    job = Job(lambda k: 100.0 * k, new_phase=ReplicaPhase.PENDING, pending_timeout_s=60)
    job.run(200)
    assert job.actions() == [(ADD, 2), (NOT_ADDED, 1)]
    assert job.workers.released == [1]
    assert "Pending" in job.scaler.decisions[-1]["reason"]


def test_nothing_is_decided_once_training_is_done():
    job = Job(lambda k: 100.0 * k)
    job.tasks.training_finished = True
    job.run(100)
    assert job.scaler.decisions == []


def test_a_restarted_master_carries_on_from_the_decisions():
    job = Job(lambda k: 400.0 * min(k, 3))
    job.run(300)
    again = Job(lambda k: 400.0 * min(k, 3))
    again.scaler.resume([op.decision for op in job.workers.ops])
    assert again.scaler.target == 3 and again.scaler.status()["settled"]
    assert again.workers.released == [3]  # retired again in the new master's task manager
    again.run(100)
    assert again.scaler.decisions == job.scaler.decisions  # settled: nothing new
