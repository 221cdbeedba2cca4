import json
import random

from elasticdl.common.job_status import JobStatus, ReplicaStatus
from elasticdl.master.status_writer import LossHistory, StatusWriter, to_pb


def test_writer_writes_json_and_publishes(tmp_path):
    published = []
    counter = {"n": 0}

    def snapshot():
        counter["n"] += 1
        return JobStatus(job_name="j", phase="Running", tasks_done=counter["n"])

    path = tmp_path / "status.json"
    writer = StatusWriter(path, snapshot, publish=published.append)
    writer.write()
    writer.write()
    data = json.loads(path.read_text())
    assert data["tasks_done"] == 2 and data["updated_at"] > 0
    assert [p.tasks_done for p in published] == [1, 2]
    assert JobStatus.from_json(path.read_text()) == published[-1]
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]  # no temp files left


def test_publish_failure_does_not_break_the_writer(tmp_path):
    def boom(status):
        raise RuntimeError("api down")

    writer = StatusWriter(tmp_path / "s.json", lambda: JobStatus(phase="Running"), publish=boom)
    assert writer.write().phase == "Running"


def test_to_pb():
    msg = to_pb(
        JobStatus(
            job_name="j",
            phase="Succeeded",
            model_version=7,
            records_trained=10,
            records_expected=10,
            evaluation_metrics={"accuracy": 0.5},
            replicas=[
                ReplicaStatus(type="worker", id=2, phase="Failed", restarts=1, exit_code=137),
                ReplicaStatus(type="ps", id=0, phase="Running", exit_code=None),
            ],
        )
    )
    assert (msg.job_name, msg.phase, msg.model_version, msg.records_trained) == (
        "j",
        "Succeeded",
        7,
        10,
    )
    assert dict(msg.evaluation_metrics) == {"accuracy": 0.5}
    assert [(r.type, r.id, r.relaunch_count, r.exit_code) for r in msg.replicas] == [
        ("worker", 2, 1, 137),
        ("ps", 0, 0, 0),
    ]


def test_loss_history_keeps_an_evenly_thinned_curve_within_its_bound():
    history = LossHistory(max_samples=8)
    for step in range(8):
        history.add(step, 10.0 - step)
    assert [s["model_version"] for s in history.samples()] == list(range(8))
    for step in range(8, 37):
        history.add(step, 1.0)
    # Three fills: every 8th report is kept, from the first on.
    assert [s["model_version"] for s in history.samples()] == [0, 8, 16, 24, 32]
    for step in range(37, 41):
        history.add(step, 1.0)
    assert [s["model_version"] for s in history.samples()] == [0, 8, 16, 24, 32, 40]


def test_loss_history_orders_reports_by_model_version_whatever_their_arrival():
    # Two workers: the task that ended at version 11 is reported before the one that ended at 10.
    history = LossHistory()
    for version, loss in ((9, 0.9), (11, 1.1), (10, 1.0), (10, 1.05), (12, 1.2)):
        history.add(version, loss)
    assert [(s["model_version"], s["loss"]) for s in history.samples()] == [
        (9, 0.9),
        (10, 1.0),
        (10, 1.05),
        (11, 1.1),
        (12, 1.2),
    ]
    # Thinning keeps the order: 200 reports arriving shuffled, 8 kept at most.
    history = LossHistory(max_samples=8)
    for version in random.Random(0).sample(range(200), 200):
        history.add(version, 1.0)
    versions = [s["model_version"] for s in history.samples()]
    assert 4 <= len(versions) <= 8 and versions == sorted(versions)


def test_loss_history_skips_values_json_cannot_carry():
    history = LossHistory()
    history.add(1, float("nan"))
    history.add(2, float("inf"))
    history.add(3, 0.5)
    assert history.samples() == [{"model_version": 3, "loss": 0.5}]
