"""Rendering job lists and statuses."""

from elasticdl.client.output import format_age, jobs_table, status_text
from elasticdl.common.job_status import JobStatus


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
