"""A restartable master on Kubernetes: the job's master pod is run by a batch/v1
Job; its process is SIGKILLed mid-job, the Job controller makes a new master pod, the new master
resumes from the journal in ``--job_dir`` (on a ``--volume``), adopts the running PS and worker
pods by name and UID instead of starting new ones. Then the new master's pod is deleted (as a
drain or an eviction does): that master leaves the job to the next one instead of cancelling
it. The job trains every record once; ``cancel`` removes the Job and everything it owns, and no master comes back.

Real: the client, master, PS and workers (TensorFlow), the API server, the garbage collector and
the Job controller. FAKE: the kubelet (``process_kubelet``): pods are local processes sharing
127.0.0.1 (``ELASTICDL_K8S_NETWORK=host`` addressing), and it ignores volumes, so the hostPath
``--volume`` and the ``--job_dir`` under it are the same directory for this test and the pods.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from pathlib import Path

import pytest
from elasticdl_tests.k8s.e2e_test import _fashion_mnist_subset
from elasticdl_tests.k8s.kubelet_jobs import submit_train
from elasticdl_tests.waiting import wait_for

pytest.importorskip("tensorflow")
pytest.importorskip("elasticdl.master.main")
pytest.importorskip("elasticdl.worker.main")
pytest.importorskip("elasticdl.ps.main")

logger = logging.getLogger(__name__)
JOB = "k8s-restart"
RECORDS = 2 * 128
# Enough work that the kill (at the first records the status file shows) lands mid-job on a
# fast machine too: a task of 32 records takes a few ms of training here.
EPOCHS = 48
TASKS = EPOCHS * RECORDS // 32


def test_master_killed_on_kubernetes_resumes_and_adopts(
    k8s_cluster, served_namespace, kubelet, k8s, tmp_path, monkeypatch
):
    import mnist.mnist_functional_api
    from elasticdl.client.main import main
    from elasticdl.k8s.names import job_selector, replicas_selector

    zoo = Path(mnist.mnist_functional_api.__file__).resolve().parent.parent
    monkeypatch.setenv("KUBECONFIG", str(k8s_cluster.kubeconfig))  # inherited by the master
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ELASTICDL_CONFIG", raising=False)
    ns = served_namespace
    volume = tmp_path / "volume"
    job_dir = volume / "jobs" / JOB
    volume.mkdir()
    flags = [
        f"--job_name={JOB}",
        "--image_name=local/elasticdl:test",
        f"--model_zoo={zoo}",
        "--model_def=mnist.mnist_functional_api.custom_model",
        f"--training_data={_fashion_mnist_subset(tmp_path / 'train', 'train', 2, 128)}",
        "--minibatch_size=16",
        "--num_minibatches_per_task=2",
        f"--num_epochs={EPOCHS}",
        "--num_workers=2",
        "--num_ps_pods=1",
        f"--volume=host_path={volume},mount_path={volume}",
        f"--job_dir={job_dir}",
    ]
    backend, handle = submit_train(kubelet, ns, flags)
    first = handle.master
    assert first.startswith(f"elasticdl-{JOB}-master-"), first  # named by the Job controller
    # The master's Service publishes ready pods only: a master pod its Job replaced (Failed,
    # kept by the Job) is never an address of the job's master, also on Kubernetes <= 1.21.
    (service,) = k8s.list_services(f"elasticdl-job-name={JOB},elasticdl-replica-type=master")
    assert not service.spec.publish_not_ready_addresses, service.spec

    def pods(selector: str) -> dict:
        return {p.metadata.name: p for p in k8s.list_pods(selector)}

    def diagnose() -> str:
        out = [f"pods: {[(n, p.status.phase) for n, p in pods('').items()]}"]
        for name in pods(""):
            path = kubelet.log_path(ns, name)
            if path.exists():
                out.append(f"--- {name} ---\n" + path.read_text(errors="replace")[-2500:])
        return "\n".join(out)

    def status_of_restarted(restarts: int) -> int | None:
        try:
            status = json.loads((job_dir / "status.json").read_text())
        except (OSError, ValueError):
            return None
        if status.get("master", {}).get("restarts", 0) != restarts:
            return None
        return status["records_trained"] or -1

    def trained() -> int:
        try:
            return json.loads((job_dir / "status.json").read_text())["records_trained"]
        except (OSError, ValueError, KeyError):
            return 0

    # Kill the master once the workers trained some but not most of the records.
    wait_for(lambda: trained() > 0, 240, "the first records trained", diagnose)
    before = {n: p.metadata.uid for n, p in pods(replicas_selector(JOB)).items()}
    assert sorted(before) == [f"elasticdl-{JOB}-{r}" for r in ("ps-0", "worker-0", "worker-1")]
    for pod in pods(replicas_selector(JOB)).values():  # owned by the Job, not a master pod
        assert [(o.kind, o.name) for o in pod.metadata.owner_references] == [
            ("Job", f"elasticdl-{JOB}-master")
        ]
    killed_at = trained()
    assert kubelet.kill(ns, first, signal.SIGKILL)
    kill_time = time.monotonic()
    logger.info("master pod %s killed at %d records trained", first, killed_at)

    def next_master(*previous: str):
        for name, pod in pods(job_selector(JOB, "master")).items():
            if name not in previous and pod.status.phase == "Running":
                return name
        return None

    second = wait_for(lambda: next_master(first), 120, "the Job's next master pod", diagnose)
    logger.info("master pod %s runs %.1f s after the kill", second, time.monotonic() - kill_time)
    # The new master's status file (rewritten every 2 s): what it resumed, then more.
    resumed = wait_for(lambda: status_of_restarted(1), 120, "the new master's status", diagnose)
    wait_for(lambda: trained() > resumed, 300, "training to go on", diagnose)
    logger.info("trained again %.1f s after the kill", time.monotonic() - kill_time)

    # Deleting the master's pod (as a drain or an eviction does) is not a cancel: the master
    # gets SIGTERM while its Job still exists, leaves the job to the next master.
    assert trained() < RECORDS * EPOCHS, "the job ended before its master pod was deleted"
    assert k8s.delete_pod(second, grace_seconds=10)
    third = wait_for(lambda: next_master(first, second), 120, "a master after the delete", diagnose)
    deleted_log = kubelet.log_path(ns, second).read_text(errors="replace")
    assert "the job goes on under the next master" in deleted_log, deleted_log[-3000:]
    resumed = wait_for(lambda: status_of_restarted(2), 120, "the third master's status", diagnose)
    wait_for(lambda: trained() > resumed, 300, "training to go on again", diagnose)

    target = ["--platform=kubernetes", f"--namespace={ns}"]
    assert main(["wait", JOB, "--timeout=600", *target]) == 0, diagnose()
    final = json.loads((job_dir / "status.json").read_text())
    log = kubelet.log_path(ns, third).read_text(errors="replace")
    assert final["phase"] == "Succeeded", log[-3000:]
    assert killed_at < RECORDS * EPOCHS, "the job ended before its master was killed"
    assert "Resuming job" in log, log[-3000:]
    for name in before:  # adopted, not launched again: the same pods, no twins
        assert f"adopted pod {name}" in log, log[-3000:]
    assert final["records_trained"] == final["records_expected"] == RECORDS * EPOCHS
    assert final["tasks_done"] == TASKS, final  # every task counted once
    assert "launched pod" not in log, log[-3000:]  # the new master started no replica
    status = backend.status(JOB)
    assert status.phase == "Succeeded" and status.records_trained == RECORDS * EPOCHS

    # Cancel removes the Job and everything it owns; nothing starts a master again.
    backend.cancel(JOB)
    time.sleep(3)
    assert k8s.list_pods() == [] and k8s.list_services() == []
    assert k8s.list_network_policies() == [] and k8s.get_job(f"elasticdl-{JOB}-master") is None
