"""The master dies on the REAL cluster: a job submitted with ``--job_dir`` on its
hostPath ``--volume`` runs its master pod under a batch/v1 Job; ``docker kill`` of the master's
container mid-job, the real Job controller makes a new master pod (a new pod address, on either
node), the new master resumes from the journal on the volume, adopts the running PS and worker
pods (same UIDs), the workers on both nodes reach it through the master's Service name, and the
job trains every record once; ``cancel`` then leaves nothing, and no master comes back.

Everything runs in real containers (the image of ``job_test``'s ``mnist_image`` fixture).
"""

from __future__ import annotations

import json
import logging
import time
import uuid

from elasticdl.client.main import main
from elasticdl.k8s.termination import read_termination
from elasticdl_tests.k8s_node import job_test
from elasticdl_tests.k8s_node.job_test import TRAIN_RECORDS, _checkpoint_dir, _rbac, _train_argv
from elasticdl_tests.waiting import wait_for

# job_test's fixtures, used here by name.
cli_env = job_test.cli_env
data_dir = job_test.data_dir
mnist_image = job_test.mnist_image

logger = logging.getLogger(__name__)


def test_killed_master_container_is_replaced_and_the_job_resumes(
    cli_env, mnist_image, data_dir, node_namespace, node_k8s, monkeypatch, capsys, tmp_path
):
    node = cli_env
    image, ctx, _ = mnist_image
    ns = node_namespace
    _rbac(node, ns, capsys)
    monkeypatch.chdir(ctx)
    volume = _checkpoint_dir(tmp_path)  # writable by the restricted pods' user
    epochs = 4  # enough work left when the kill lands
    job = f"mkill-{uuid.uuid4().hex[:4]}"
    argv = _train_argv(job, ns, image, data_dir, epochs, volume)
    assert main([*argv, "--job_dir=/checkpoints/job"]) == 0
    target = [f"--namespace={ns}", "--platform=kubernetes"]
    masters_selector = f"elasticdl-job-name={job},elasticdl-replica-type=master"
    replicas_selector = f"elasticdl-job-name={job},elasticdl-replica-type in (ps,worker)"
    status_file = volume / "job" / "status.json"

    def diagnose() -> str:
        return node.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False) + (
            "\n--- masters ---\n"
            + node.kubectl(
                "logs", "-n", ns, "-l", masters_selector, "--tail=40", "--prefix", check=False
            )
        )

    def status() -> dict:
        try:
            return json.loads(status_file.read_text())
        except (OSError, ValueError):
            return {}

    def training_master():
        pods = [p for p in node_k8s.list_pods(masters_selector) if p.status.phase == "Running"]
        if len(pods) != 1 or not status().get("records_trained"):
            return None
        return pods[0]

    first = wait_for(training_master, 420, "the master to see records trained", diagnose)
    cid = first.status.container_statuses[0].container_id.split("://", 1)[1]
    before = {p.metadata.name: p.metadata.uid for p in node_k8s.list_pods(replicas_selector)}
    assert len(before) == 3, before
    t_kill = time.monotonic()
    node.docker_any("kill", cid)  # (on the engine of the master's node)

    def died():
        pod = node_k8s.get_pod(first.metadata.name)
        return pod is not None and read_termination(pod).is_terminal and read_termination(pod)

    assert wait_for(died, 60, "the master container to end", diagnose).exit_code == 137
    old_master_ip = first.status.pod_ip

    def resumed():
        s = status()
        return s.get("master", {}).get("restarts") == 1 and (s["records_trained"] or -1)

    at_resume = wait_for(resumed, 300, "a new master resuming the job", diagnose)
    t_resumed = time.monotonic() - t_kill
    wait_for(lambda: status()["records_trained"] > at_resume, 300, "training to go on", diagnose)
    t_trained = time.monotonic() - t_kill
    logger.info(
        "master killed: resumed after %.1f s, trained again after %.1f s", t_resumed, t_trained
    )
    after = {p.metadata.name: p.metadata.uid for p in node_k8s.list_pods(replicas_selector)}
    assert after == before  # adopted: the same pods, no new or duplicate one
    # The workers, on both nodes, found the new master (a new pod, a new address) by the name
    # of the master's Service, which they were given instead of an address.
    successor = [p for p in node_k8s.list_pods(masters_selector) if p.status.phase == "Running"]
    assert len(successor) == 1 and successor[0].status.pod_ip != old_master_ip, successor
    worker_nodes = {
        p.spec.node_name
        for p in node_k8s.list_pods(replicas_selector)
        if "-worker-" in p.metadata.name
    }
    assert worker_nodes == set(node.nodes[:2]), worker_nodes
    worker_args = " ".join(node_k8s.get_pod(f"elasticdl-{job}-worker-0").spec.containers[0].command)
    assert f"elasticdl-{job}-master.{ns}.svc:" in worker_args, worker_args
    assert main(["wait", job, "--timeout=900", *target]) == 0, diagnose()
    capsys.readouterr()
    assert main(["status", job, "-o", "json", *target]) == 0
    final = json.loads(capsys.readouterr().out)
    total = TRAIN_RECORDS * epochs
    assert final["phase"] == "Succeeded", final
    assert final["records_trained"] == final["records_expected"] == total, final
    on_volume = status()
    assert on_volume["records_trained_per_epoch"] == {
        str(e): TRAIN_RECORDS for e in range(1, epochs + 1)
    }, on_volume
    assert main(["cancel", job, *target]) == 0
    # The pods end within their grace period, longer than it on a loaded machine.
    wait_for(
        lambda: node_k8s.list_pods(f"elasticdl-job-name={job}") == [],
        120,
        "the job's pods to be gone after cancel",
        diagnose,
    )
    time.sleep(3)  # a master the Job started after cancel would show up here
    assert node_k8s.list_pods(f"elasticdl-job-name={job}") == []
    assert node_k8s.get_job(f"elasticdl-{job}-master") is None
