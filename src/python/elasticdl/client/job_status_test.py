"""Parsing and presenting job status."""

from elasticdl.client.job_status import JobPhase, JobStatus, format_age
from elasticdl.client.output import jobs_table, status_text


def test_from_dict_ignores_unknown_and_fills_missing():
    status = JobStatus.from_dict(
        {
            "job_name": "a",
            "phase": "Running",
            "tasks_done": 3,
            "new_field": 1,
            "replicas": [
                {
                    "replica_type": "worker",
                    "replica_id": 2,
                    "phase": "Running",
                    "relaunches": 1,
                    "x": 0,
                }
            ],
            "updated_at": "2024-01-01T00:00:00Z",
        },
        platform="local",
    )
    assert status.phase == "Running" and status.tasks_done == 3 and status.platform == "local"
    assert status.replicas[0].name == "worker-2" and status.replicas[0].restarts == 1
    assert status.updated_at == 1704067200.0
    assert status.evaluation_metrics == {}
    assert not status.is_final and JobStatus.from_dict({"phase": "Cancelled"}).is_final


def test_progress():
    assert JobStatus("a", records_trained=50, records_expected=200).progress == "25%"
    assert JobStatus("a", tasks_done=1, tasks_todo=2, tasks_doing=1).progress == "25%"
    assert JobStatus("a").progress == "-"
    assert JobStatus("a", phase=JobPhase.SUCCEEDED).progress == "100%"


def test_age():
    assert format_age(None) == "-"
    assert format_age(100, now=145) == "45s"
    assert format_age(0, now=600) == "10m"
    assert format_age(0, now=3 * 3600) == "3h"
    assert format_age(0, now=5 * 86400) == "5d"


def test_table_and_text():
    jobs = [JobStatus("a", platform="local", phase="Running", model_version=7, created_at=None)]
    lines = jobs_table(jobs).splitlines()
    assert lines[0].split() == ["NAME", "PLATFORM", "PHASE", "AGE", "VERSION", "PROGRESS"]
    assert lines[1].split() == ["a", "local", "Running", "-", "7", "-"]
    text = status_text(
        JobStatus.from_dict({"job_name": "a", "evaluation_metrics": {"auc": 0.91234}})
    )
    assert "Evaluation:  auc=0.9123" in text
