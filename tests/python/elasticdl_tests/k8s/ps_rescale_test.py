"""The PS count of a job on Kubernetes changes both ways through the client: ``elasticdl
scale-ps --platform=kubernetes`` writes the request on the master pod, the master (whose
pod it is) re-shards through the checkpoint directory every PS pod mounts, launches the new
PS set (a Service per new PS id, the Services of ids a smaller set gives up deleted), and
answers on its pod; the client prints the answer. 1 -> 2 -> 1 PS, and the job Succeeds with
every record trained once (the master's accounting). A request the master refuses is a
one-line error and a non-zero exit.

Real: the client, master, PS and workers (TensorFlow), the API server. FAKE: the kubelet
(``process_kubelet``): pods are local processes on 127.0.0.1 (host network addressing), so
the host-path volume of the checkpoint directory is the same directory to every PS.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from elasticdl_tests.k8s.e2e_test import _fashion_mnist_subset
from elasticdl_tests.k8s.kubelet_jobs import submit_train
from elasticdl_tests.waiting import wait_for

pytest.importorskip("tensorflow")
pytest.importorskip("elasticdl.master.main")

JOB = "k8s-ps-rescale"
EPOCHS = 150  # of 192 records: long enough to outlive both changes on a loaded machine
RECORDS = EPOCHS * 192


def test_a_kubernetes_job_scales_its_ps_up_and_down_through_the_client(
    k8s_cluster, served_namespace, kubelet, k8s, tmp_path, monkeypatch, capsys
):
    import mnist.mnist_functional_api
    from elasticdl.client.main import main

    zoo = Path(mnist.mnist_functional_api.__file__).resolve().parent.parent
    monkeypatch.setenv("KUBECONFIG", str(k8s_cluster.kubeconfig))
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ELASTICDL_CONFIG", raising=False)
    ns = served_namespace
    shared = tmp_path / "shared"
    shared.mkdir()
    flags = [
        f"--job_name={JOB}",
        "--image_name=local/elasticdl:test",
        f"--model_zoo={zoo}",
        "--model_def=mnist.mnist_functional_api.custom_model",
        f"--training_data={_fashion_mnist_subset(tmp_path / 'train', 'train', 2, 96)}",
        "--minibatch_size=16",
        "--num_minibatches_per_task=1",
        f"--num_epochs={EPOCHS}",
        "--num_workers=2",
        "--num_ps_pods=1",
        f"--volume=host_path={shared},mount_path={shared}",
        f"--checkpoint_dir={shared}/ckpt",
        "--master_resource_request=cpu=0.1,memory=256Mi",
        "--worker_resource_request=cpu=0.1,memory=512Mi",
        "--ps_resource_request=cpu=0.1,memory=256Mi",
    ]
    backend, _ = submit_train(kubelet, ns, flags)
    target = ["--platform=kubernetes", f"--namespace={ns}"]

    def diagnose() -> str:
        pods = [(p.metadata.name, p.status.phase) for p in k8s.list_pods()]
        logs = []
        for name, _ in pods:
            path = kubelet.log_path(ns, name)
            if path.exists():
                logs.append(f"--- {name} ---\n" + path.read_text(errors="replace")[-2500:])
        return f"pods: {pods}\n" + "\n".join(logs)

    def trained() -> int:
        status = backend.status(JOB)
        if status.is_final:
            pytest.fail(f"the job ended first: {status.phase}\n{diagnose()}")
        return status.records_trained

    def scale(num_ps: int, generation: int) -> dict:
        capsys.readouterr()
        code = main(["scale-ps", JOB, f"--num_ps={num_ps}", "--timeout=120", *target])
        said = capsys.readouterr().err
        assert code == 0 and f"-> {num_ps}" in said, (code, said, diagnose())

        def done():
            changes = backend.status(JOB).ps_scaling.get("changes", [])
            if len(changes) == generation and changes[-1]["state"] in ("done", "failed"):
                return changes[-1]
            return None

        change = wait_for(done, 180, f"the change to {num_ps} PS", diagnose)
        assert change["state"] == "done", (change, diagnose())
        status = backend.status(JOB)
        assert status.phase == "Running" and status.records_trained < RECORDS, (
            "the job must outlive the change: make it longer",
            status.records_trained,
        )
        return change

    wait_for(lambda: trained() >= 10 * 16, 300, "10 tasks trained", diagnose)
    # Refused: the job runs 1 PS already (one line, non-zero exit, nothing changes).
    capsys.readouterr()
    assert main(["scale-ps", JOB, "--num_ps=1", "--timeout=60", *target]) != 0
    refused = capsys.readouterr().err.strip()
    assert "runs 1 PS already" in refused and "\n" not in refused, refused

    up = scale(2, generation=1)
    assert (up["from_ps"], up["to_ps"]) == (1, 2) and up["version"] > 0, up
    assert k8s.get_service(f"elasticdl-{JOB}-ps-1") is not None  # the new PS id's Service
    down = scale(1, generation=2)
    assert (down["from_ps"], down["to_ps"]) == (2, 1) and down["version"] >= up["version"]
    wait_for(
        lambda: k8s.get_service(f"elasticdl-{JOB}-ps-1") is None,
        30,
        "the Service of the PS id the smaller set gave up to go",
    )
    assert k8s.get_service(f"elasticdl-{JOB}-ps-0") is not None

    assert main(["wait", JOB, "--timeout=900", *target]) == 0, diagnose()
    final = backend.status(JOB)
    master_log = "".join(backend.logs(JOB))
    assert final.phase == "Succeeded", master_log[-3000:]
    assert final.records_trained == final.records_expected == RECORDS
    assert f"trained {RECORDS}/{RECORDS} records" in master_log
    assert final.ps_scaling["num_ps"] == 1 and final.ps_scaling["generation"] == 2
    assert "PS count 1 -> 2 (PS set 1" in master_log and "PS count 2 -> 1 (PS set 2" in master_log
    # A swapped PS set is no PS failure: nothing relaunched (the old set's ends are its own).
    assert "ended while the job runs" not in master_log, master_log[-3000:]
    # Each new PS started from the snapshot the change wrote.
    ps1_log = kubelet.log_path(ns, f"elasticdl-{JOB}-ps-1").read_text(errors="replace")
    assert f"restored version {up['version']}" in ps1_log, ps1_log[-2000:]
    assert backend.cancel(JOB).phase == "Succeeded"
