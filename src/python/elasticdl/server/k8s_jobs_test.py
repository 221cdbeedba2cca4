"""The master's row among a Kubernetes job's replicas on the dashboard (``master_replica``).
The cluster side: tests/python/elasticdl_tests/k8s/dashboard_test.py (a bare master pod)."""

from __future__ import annotations

import datetime

import pytest

pytest.importorskip("kubernetes")

from elasticdl.k8s.client import to_model  # noqa: E402
from elasticdl.k8s.names import LABEL_JOB, LABEL_REPLICA_TYPE  # noqa: E402
from elasticdl.server.k8s_jobs import master_replica  # noqa: E402

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def _master(suffix: str, minute: int, phase: str, state: dict):
    status = {"name": "main", "state": state, "image": "i", "imageID": "", "ready": False}
    return to_model(
        {
            "metadata": {
                "name": f"elasticdl-j-master-{suffix}",
                "labels": {LABEL_JOB: "j", LABEL_REPLICA_TYPE: "master"},
                "creationTimestamp": (T0 + datetime.timedelta(minutes=minute)).isoformat(),
            },
            "spec": {"containers": [{"name": "main", "image": "i"}]},
            "status": {"phase": phase, "containerStatuses": [{**status, "restartCount": 0}]},
        },
        "V1Pod",
    )


def test_a_restarted_master_counts_the_masters_that_died():
    died = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
    pods = [
        _master("a", 0, "Failed", died),
        _master("c", 9, "Running", {"running": {}}),
        _master("b", 5, "Failed", died),
    ]
    row = master_replica(pods)
    assert (row.name, row.type, row.phase, row.exit_code, row.restarts) == (
        "master",
        "master",
        "Running",
        None,
        2,
    )


def test_a_bare_master_that_ended():
    row = master_replica([_master("x", 0, "Succeeded", {"terminated": {"exitCode": 0}})])
    assert (row.phase, row.exit_code, row.restarts) == ("Succeeded", 0, 0)
    died = master_replica(
        [_master("x", 0, "Failed", {"terminated": {"exitCode": 137, "reason": "Error"}})]
    )
    assert (died.phase, died.exit_code, died.restarts, died.message) == ("Failed", 137, 0, "Error")
