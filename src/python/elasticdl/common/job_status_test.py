"""The one status type: what the master writes is what the client reads."""

import json

from elasticdl.common.job_status import JobStatus, MetricsHistory, ReplicaStatus
from elasticdl.common.types import JobPhase


def _written_by_a_master() -> JobStatus:
    return JobStatus(
        job_name="a",
        platform="local",
        job_type="training_with_evaluation",
        phase=JobPhase.RUNNING,
        tasks_done=3,
        records_trained=192,
        records_expected=640,
        records_trained_per_epoch={"1": 192},
        evaluation_metrics={"accuracy": 0.5},
        evaluation_history=[{"model_version": 10, "metrics": {"accuracy": 0.5}}],
        loss_history=[{"model_version": 4, "loss": 2.0}, {"model_version": 9, "loss": 1.5}],
        replicas=[ReplicaStatus("worker-0", "worker", 0, "Failed", 137, 0, 12, "Preempted", 2)],
        master={"pid": 1, "port": 50001},
        created_at=1.0,
    )


def test_round_trip_is_lossless():
    written = _written_by_a_master()
    text = written.to_json()
    assert json.loads(text)["phase"] == "Running"  # plain strings, not enum reprs
    assert JobStatus.from_json(text) == written


def test_from_dict_ignores_unknown_and_fills_missing():
    status = JobStatus.from_dict(
        {
            "job_name": "a",
            "phase": "Running",
            "tasks_done": 3,
            "field_of_a_newer_master": 1,
            "replicas": [{"type": "worker", "id": 2, "phase": "Running", "restarts": 1, "x": 0}],
            "updated_at": "2024-01-01T00:00:00Z",
            "evaluation_metrics": None,
        },
        platform="local",
    )
    assert status.phase == "Running" and status.tasks_done == 3 and status.platform == "local"
    assert status.replicas[0].name == "worker-2" and status.replicas[0].restarts == 1
    assert status.updated_at == 1704067200.0
    assert status.evaluation_metrics == {} and status.records_trained_per_epoch == {}
    assert not status.is_final and JobStatus.from_dict({"phase": "Cancelled"}).is_final


def test_progress():
    assert JobStatus("a", records_trained=50, records_expected=200).progress == "25%"
    # Epoch 2 of 10 created (records_expected counts 2 epochs' records): 150 of 1,000.
    status = JobStatus("a", records_trained=150, records_expected=200, epoch=2, num_epochs=10)
    assert status.progress == "15%"
    assert (
        JobStatus("a", records_trained=200, records_expected=200, epoch=2, num_epochs=2).progress
        == "100%"
    )
    assert JobStatus("a", tasks_done=1, tasks_todo=2, tasks_doing=1).progress == "25%"
    assert JobStatus("a").progress == "-"
    assert JobStatus("a", phase=JobPhase.SUCCEEDED).progress == "100%"


def test_metrics_history_of_a_status_read_back():
    text = _written_by_a_master().to_json()
    history = MetricsHistory.of(JobStatus.from_json(text)).to_dict()
    assert history["job_name"] == "a" and history["phase"] == "Running"
    assert history["loss"] == [
        {"model_version": 4, "loss": 2.0},
        {"model_version": 9, "loss": 1.5},
    ]
    assert history["evaluation"] == [{"model_version": 10, "metrics": {"accuracy": 0.5}}]
    # An older master (no loss_history) or a mangled one reads as an empty curve.
    assert MetricsHistory.of(JobStatus.from_dict({"loss_history": "x"})).loss == []
    assert MetricsHistory.of(JobStatus.from_dict({"loss_history": [1, {"loss": 2}]})).loss == []


def test_a_published_status_keeps_thinned_curves():
    from elasticdl.common.job_status import PUBLISHED_EVALUATIONS, PUBLISHED_LOSS_SAMPLES, thinned

    assert thinned(list(range(5)), 10) == [0, 1, 2, 3, 4]
    assert thinned(list(range(101)), 5) == [0, 25, 50, 75, 100]
    status = _written_by_a_master()
    status.loss_history = [{"model_version": v, "loss": 1 / (v + 1)} for v in range(1000)]
    status.evaluation_history = [
        {"model_version": v, "metrics": {"accuracy": v / 500}} for v in range(0, 1000, 2)
    ]
    published = status.published()
    assert "records_trained_per_epoch" not in published
    read = MetricsHistory.of(JobStatus.from_json(json.dumps(published)))
    assert len(read.loss) == PUBLISHED_LOSS_SAMPLES
    assert len(read.evaluation) == PUBLISHED_EVALUATIONS
    # From the first point to the last, versions rising: the whole curve, coarser.
    assert read.loss[0] == status.loss_history[0] and read.loss[-1] == status.loss_history[-1]
    assert read.evaluation[-1] == status.evaluation_history[-1]
    versions = [s["model_version"] for s in read.loss]
    assert versions == sorted(set(versions))
    assert len(json.dumps(published)) < 32 << 10  # well under a pod's 256 KiB of annotations


def test_workers_by_phase_eta_and_bad_speed_values():
    status = JobStatus.from_dict(
        {
            "phase": "Running",
            "eta_seconds": 250.4,
            "records_per_second": "fast",  # not a number: unknown
            "replicas": [
                {"type": "worker", "id": 0, "phase": "Running"},
                {"type": "worker", "id": 1, "phase": "Pending", "waiting_reason": "Unschedulable"},
                {"type": "worker", "id": 2, "phase": "Failed"},
                {"type": "ps", "id": 0, "phase": "Running"},
            ],
        }
    )
    assert status.records_per_second is None and status.eta == "4m10s"
    assert status.workers_summary == "1/2 (1 pending)"
    assert [r.name for r in status.workers()["Pending"]] == ["worker-1"]
    assert status.workers()["Pending"][0].waiting_reason == "Unschedulable"
    assert JobStatus.from_dict({}).workers_summary == "-" and JobStatus().eta == "-"
    assert JobStatus.from_json(status.to_json()) == status
