"""How ``elasticdl status`` and the dashboard show a Kubernetes job's replicas: what the master
published, brought up to date with the replica pods (``settle_replicas``). The cluster side:
tests/python/elasticdl_tests/k8s/dashboard_test.py (a finished job's PS shown Deleted)."""

from __future__ import annotations

import pytest

pytest.importorskip("kubernetes")

from elasticdl.common.job_status import ReplicaStatus  # noqa: E402
from elasticdl.jobs.k8s_status import settle_replicas  # noqa: E402
from elasticdl.k8s.client import to_model  # noqa: E402
from elasticdl.k8s.names import LABEL_REPLICA_INDEX, LABEL_REPLICA_TYPE  # noqa: E402


def _pod(rtype: str, rid: int, phase: str, exit_code: int | None = None):
    state = {"running": {}} if exit_code is None else {"terminated": {"exitCode": exit_code}}
    if exit_code is not None:
        state["terminated"]["reason"] = "Completed" if exit_code == 0 else "Error"
    return to_model(
        {
            "metadata": {
                "name": f"elasticdl-j-{rtype}-{rid}",
                "labels": {LABEL_REPLICA_TYPE: rtype, LABEL_REPLICA_INDEX: str(rid)},
            },
            "spec": {"containers": [{"name": "main", "image": "i"}]},
            "status": {
                "phase": phase,
                "containerStatuses": [
                    {
                        "name": "main",
                        "state": state,
                        "image": "i",
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                    }
                ],
            },
        },
        "V1Pod",
    )


def _published(name: str, phase: str, **kwargs) -> ReplicaStatus:
    rtype, _, rid = name.partition("-")
    return ReplicaStatus(name=name, type=rtype, id=int(rid), phase=phase, **kwargs)


def test_a_finished_job_shows_no_replica_running():
    # The master's last publication: it deleted ps-0 and worker-1 at the end, before seeing
    # them go; worker-0 had ended; worker-2 replaced a worker and was relaunched once.
    published = [
        _published("ps-0", "Running"),
        _published("worker-0", "Succeeded", exit_code=0, message="Completed"),
        _published("worker-1", "Running"),
        _published("worker-2", "Running", restarts=1),
    ]
    pods = [_pod("worker", 1, "Failed", exit_code=143), _pod("worker", 2, "Running")]
    settled = {r.name: r for r in settle_replicas(published, pods, job_final=True)}
    assert (settled["ps-0"].phase, settled["ps-0"].message) == ("Deleted", "Deleted")
    assert settled["worker-0"] == published[1]
    assert (settled["worker-1"].phase, settled["worker-1"].exit_code) == ("Failed", 143)
    assert settled["worker-1"].message == "Error"
    # A pod still running stays as published, with what only the master knows.
    assert settled["worker-2"] == published[3] and settled["worker-2"].restarts == 1


def test_a_running_job_keeps_replicas_whose_pods_are_not_there_yet():
    published = [_published("worker-0", "Pending"), _published("ps-0", "Running")]
    settled = settle_replicas(published, [_pod("ps", 0, "Succeeded", exit_code=0)], False)
    assert [(r.name, r.phase, r.exit_code) for r in settled] == [
        ("worker-0", "Pending", None),
        ("ps-0", "Succeeded", 0),
    ]
