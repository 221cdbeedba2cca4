"""A real job loses a node: the elastic fault ElasticDL exists for, on the real cluster.

A parameter-server job (default ``pod`` network mode) runs with its master on node 1, its PS on
node 2 (a preference given by ``--cluster_spec_json``) and a worker on each node (ElasticDL's own
spread). Mid-job ``start-node.sh stop-node 2`` kills node 2's kubelet, its engine and every
container on it at once, as when a machine dies. Then, with nothing done by hand:

* the node controller marks the node NotReady and taints it; the job's pods tolerate that for
  ``--node_lost_timeout`` seconds (not Kubernetes' 300) and are evicted;
* the master reads the taint manager's eviction Event (it names the pod but not its uid) and
  ends the lost replicas at once as evicted, which uses no relaunch budget; nothing confirms
  the eviction (the kubelet is dead), so it force-deletes its pods that outlive their
  deletion deadline (``platform/k8s_lost_pods.py``) and ps-0's name is free again;
* the lost worker's tasks go back to the queue and a new worker runs on node 1; ps-0 is started
  again under its name on node 1 and restores the newest checkpoint from the volume; the
  workers on node 1 wait for it (their PS retry window) instead of failing;
* the job Succeeds with every record counted once.

Node 2 is started again afterwards (the module has the cluster to itself: ``exclusive_cluster``).
"""

from __future__ import annotations

import json
import re
import time
import uuid

from elasticdl.client.main import main

# The job's fixtures and argv: the same job as job_test.py's.
from elasticdl_tests.k8s_node.job_test import (  # noqa: F401  (fixtures, used by name)
    TRAIN_RECORDS,
    _checkpoint_dir,
    _rbac,
    _train_argv,
    cli_env,
    data_dir,
    mnist_image,
)
from elasticdl_tests.waiting import wait_for

EPOCHS = 12  # enough work left when the node goes (an epoch takes ~3 s on two workers)
# Shorter than the flag's default (30 s): the eviction path is the same, the job waits less.
NODE_LOST_TIMEOUT_S = 10


def _placement(node, ns: str, job: str) -> dict[str, str]:
    """Running, not-deleted pods of the job -> their node."""
    pods = json.loads(node.kubectl("get", "pods", "-n", ns, "-o", "json"))["items"]
    return {
        p["metadata"]["name"].replace(f"elasticdl-{job}-", ""): p["spec"].get("nodeName", "")
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


def test_a_job_loses_a_node_and_finishes_on_the_other(
    exclusive_cluster,
    cli_env,  # noqa: F811
    mnist_image,  # noqa: F811
    data_dir,  # noqa: F811
    node_namespace,
    node_k8s,
    monkeypatch,
    capsys,
    tmp_path,
):
    node, ns = exclusive_cluster, node_namespace
    survivor, lost = node.nodes[0], node.nodes[1]
    image, ctx, _ = mnist_image
    _rbac(node, ns, capsys)
    monkeypatch.chdir(ctx)
    checkpoints = _checkpoint_dir(tmp_path)
    job = f"nodeloss-{uuid.uuid4().hex[:4]}"
    placement = {
        "master_pod_spec": {"node_selector": {"kubernetes.io/hostname": survivor}},
        "ps_pod_spec": {
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 100,
                            "preference": {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": [lost],
                                    }
                                ]
                            },
                        }
                    ]
                }
            }
        },
    }
    argv = _train_argv(job, ns, image, data_dir, EPOCHS, checkpoints)
    argv.append(f"--cluster_spec_json={json.dumps(placement)}")
    argv.append(f"--node_lost_timeout={NODE_LOST_TIMEOUT_S}")
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
    target = [f"--namespace={ns}", "--platform=kubernetes"]

    def diagnose() -> str:
        return (
            node.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False)
            + node.kubectl("get", "nodes", check=False)
            + "\n--- master ---\n"
            + node.kubectl("logs", "-n", ns, f"elasticdl-{job}-master", "--tail=80", check=False)
        )

    def training_with_a_checkpoint():
        placed = _placement(node, ns, job)
        written = [p for p in checkpoints.rglob("*") if p.is_file()]
        wanted = {"master", "ps-0", "worker-0", "worker-1"}
        return wanted <= set(placed) and written and placed

    placed = wait_for(training_with_a_checkpoint, 400, "the job to train and checkpoint", diagnose)
    assert placed["master"] == survivor and placed["ps-0"] == lost, placed
    # One worker on each node: ElasticDL's preference, no placement given for them.
    assert {placed["worker-0"], placed["worker-1"]} == {survivor, lost}, placed
    lost_worker = next(w for w in ("worker-0", "worker-1") if placed[w] == lost)
    total = TRAIN_RECORDS * EPOCHS

    def lost_worker_at_work():
        """The lost worker has reported a task, so it holds its next one (a report is answered
        with the next task in the same call) while most of the job is still to do. Without
        this the node can go before that worker's first request for work (its peer may train
        a whole epoch meanwhile), and then it has no task to take back."""
        capsys.readouterr()
        if main(["status", job, "-o", "json", *target]) != 0:
            return None
        status = json.loads(capsys.readouterr().out)
        assert (
            status["records_trained"] < total // 2
        ), f"the job is past half-way before {lost_worker} reported a task; {status}"
        replicas = {r["name"]: r for r in status["replicas"]}
        return replicas.get(lost_worker, {}).get("tasks_done", 0) >= 1

    wait_for(lost_worker_at_work, 300, f"{lost_worker} on node {lost} to report a task", diagnose)

    ps0 = f"elasticdl-{job}-ps-0"
    old_ps = node_k8s.get_pod(ps0).metadata.uid
    t_lost = time.monotonic()
    r = node.script("stop-node", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    try:

        def restored_ps() -> str:
            pod = node_k8s.get_pod(ps0)
            if pod is None or pod.metadata.uid == old_ps or pod.status.phase != "Running":
                return ""
            assert pod.spec.node_name == survivor, pod.spec.node_name
            log = node_k8s.read_pod_log(ps0) or ""
            return log if re.search(r"PS 0 restored version \d+ from /checkpoints", log) else ""

        wait_for(restored_ps, 600, "ps-0 to restore its checkpoint on the other node", diagnose)
        ps_back_s = time.monotonic() - t_lost
        assert main(["wait", job, "--timeout=900", *target]) == 0, diagnose()
        done_s = time.monotonic() - t_lost
        capsys.readouterr()
        assert main(["status", job, "-o", "json", *target]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["phase"] == "Succeeded", status
        assert status["records_trained"] == status["records_expected"] == total, status
        replicas = {r["name"]: r for r in status["replicas"]}
        gone = replicas[lost_worker]
        # Evicted with its node, replaced by a new worker, without using the relaunch budget.
        assert gone["ended_by"] == "evicted" and gone["replaced_by"] is not None, gone
        replacement = replicas[f"worker-{gone['replaced_by']}"]
        assert replacement["restarts"] == 0, replacement
        assert status["tasks_recovered"] >= 1, (
            str({k: status[k] for k in ("tasks_recovered", "tasks_retried", "stragglers")})
            + diagnose()
        )
        capsys.readouterr()
        assert main(["logs", job, *target]) == 0
        master_log = capsys.readouterr().out
        assert re.search(r"pod elasticdl-\S+-ps-0 is still there .* does not answer", master_log)
        assert f"trained {total}/{total} records" in master_log, master_log[-3000:]
        with capsys.disabled():
            print(
                f"\nnode loss: node {lost} stopped -> ps-0 restored on {survivor} "
                f"{ps_back_s:.0f}s -> job Succeeded {done_s:.0f}s; "
                f"{status['tasks_recovered']} task(s) recovered, {total} records"
            )
        assert main(["cancel", job, *target]) == 0
    finally:
        r = node.script("start-node", "2")
        assert r.returncode == 0, r.stderr[-2000:]
