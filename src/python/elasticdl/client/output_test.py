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
    assert lines[0].split() == [
        "NAME",
        "PLATFORM",
        "PHASE",
        "AGE",
        "VERSION",
        "WORKERS",
        "PROGRESS",
    ]
    assert lines[1].split() == ["a", "local", "Running", "-", "7", "-", "-"]
    text = status_text(
        JobStatus.from_dict({"job_name": "a", "evaluation_metrics": {"auc": 0.91234}})
    )
    assert "Evaluation:  auc=0.9123" in text


def _waiting_job() -> JobStatus:
    why = "0/2 nodes are available: 2 Insufficient cpu."
    return JobStatus.from_dict(
        {
            "job_name": "elastic",
            "platform": "kubernetes",
            "phase": "Running",
            "records_trained": 4200,
            "records_expected": 10000,
            "records_per_second": 412.0,
            "eta_seconds": 14.1,
            "replicas": [
                {"type": "ps", "id": 0, "phase": "Running"},
                {"type": "worker", "id": 0, "phase": "Running"},
                {"type": "worker", "id": 1, "phase": "Running"},
                {
                    "type": "worker",
                    "id": 2,
                    "phase": "Deleted",
                    "ended_by": "preempted",
                    "message": "Preempted by default/online-0 on node n1",
                    "replaced_by": 4,
                },
                {
                    "type": "worker",
                    "id": 3,
                    "phase": "Pending",
                    "waiting_reason": "Unschedulable",
                    "waiting_message": why,
                },
                {
                    "type": "worker",
                    "id": 4,
                    "phase": "Pending",
                    "waiting_reason": "Unschedulable",
                    "waiting_message": why,
                },
            ],
        }
    )


def test_running_vs_pending_workers_why_and_the_eta():
    job = _waiting_job()
    (row,) = jobs_table([job]).splitlines()[1:]
    assert "2/4 (2 pending)" in row and row.split()[-1] == "42%"
    text = status_text(job)
    assert "Progress:    42% (4200/10000 records), 412 records/s now, ETA 14s" in text
    assert "Workers:     2 running, 2 pending" in text
    assert (
        "  pending worker-3, worker-4: Unschedulable: 0/2 nodes are available: 2 Insufficient cpu."
        in text
    )
    assert "ended from outside: 1 preempted (relaunched without using the relaunch budget)" in text
    (w2,) = [line for line in text.splitlines() if line.strip().startswith("worker-2")]
    assert "preempted: Preempted by default/online-0 on node n1" in w2
    # No recent progress: no ETA rather than an old one.
    job.eta_seconds = None
    assert "412 records/s now, ETA unknown (no progress lately)" in status_text(job)
    # A finished job shows neither.
    job.phase = "Succeeded"
    assert "ETA" not in status_text(job) and "Workers:" not in status_text(job)


def test_ps_scaling_shows_each_change_and_its_pause():
    status = JobStatus(
        "a",
        phase="Running",
        ps_scaling={
            "num_ps": 1,
            "generation": 2,
            "changes": [
                {"from_ps": 1, "to_ps": 2, "state": "done", "pause_s": 3.912, "version": 56},
                {"from_ps": 2, "to_ps": 1, "state": "failed", "error": "the job ended first"},
            ],
        },
    )
    text = status_text(status)
    assert "PS scaling:  1 PS now" in text
    assert "  1 -> 2 PS: done, training paused 3.91 s at model version 56" in text
    assert "  2 -> 1 PS: failed: the job ended first" in text
    assert "PS scaling" not in status_text(JobStatus("b", phase="Running"))
