"""End to end on Kubernetes: ``elasticdl train --platform=kubernetes`` submits a master pod,
the master creates PS and worker pods through the API server, they train the model zoo's MNIST
CNN on real Fashion-MNIST records; a worker pod deleted mid-job is relaunched and no task is
lost; then status / wait / logs / cancel, and nothing is left in the namespace.

Also: the master splits ``--worker_pod_priority=<fraction>`` over its worker pods.

Real: the client, master, PS and workers (TensorFlow), the API server, the garbage
collector. FAKE: the kubelet (``process_kubelet``) — pods run as local processes in this
Python environment (the image ``local/elasticdl:test`` is never pulled or run), all on
127.0.0.1, so the job uses ``ELASTICDL_K8S_NETWORK=host`` addressing.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from elasticdl_tests.k8s.kubelet_jobs import submit_train
from elasticdl_tests.waiting import wait_for

pytest.importorskip("tensorflow")
pytest.importorskip("elasticdl.master.main")
pytest.importorskip("elasticdl.worker.main")
pytest.importorskip("elasticdl.ps.main")

JOB = "k8s-e2e"
EPOCHS = 40  # of the worker-deletion job: 192 records each


def _fashion_mnist_subset(directory: Path, split: str, files: int, per_file: int) -> str:
    """The first `per_file` records of `files` shards of the real Fashion-MNIST `split`,
    prepared once per machine (the same cache as the local end-to-end tests)."""
    import os

    from elasticdl.data.datasets import prepare
    from elasticdl.data.recordio import Scanner, Writer

    source = Path.home() / ".cache" / "elasticdl" / "e2e" / "fashion_mnist"
    source = Path(os.environ.get("ELASTICDL_E2E_DATA") or source)
    prepare("fashion_mnist", str(source), progress=False)
    directory.mkdir(parents=True)
    shards = sorted(n for n in os.listdir(source / split) if not n.startswith("."))[:files]
    for name in shards:
        scanner = Scanner(str(source / split / name), 0, per_file)
        with Writer(str(directory / name)) as w:
            record = scanner.record()
            while record is not None:
                w.write(record)
                record = scanner.record()
        scanner.close()
    return str(directory)


def test_train_on_kubernetes_with_worker_pod_deleted(
    k8s_cluster, served_namespace, kubelet, k8s, tmp_path, monkeypatch
):
    import mnist.mnist_functional_api
    from elasticdl.client.main import main
    from elasticdl.common.job_status import MetricsHistory

    zoo = Path(mnist.mnist_functional_api.__file__).resolve().parent.parent
    monkeypatch.setenv("KUBECONFIG", str(k8s_cluster.kubeconfig))  # inherited by the master process
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ELASTICDL_CONFIG", raising=False)
    ns = served_namespace
    flags = [
        f"--job_name={JOB}",
        "--image_name=local/elasticdl:test",
        f"--model_zoo={zoo}",
        "--model_def=mnist.mnist_functional_api.custom_model",
        f"--training_data={_fashion_mnist_subset(tmp_path / 'train', 'train', 2, 96)}",
        f"--validation_data={_fashion_mnist_subset(tmp_path / 'val', 'test', 1, 64)}",
        "--minibatch_size=16",
        "--num_minibatches_per_task=1",
        # Enough epochs that work is left when the master sees the deletion, even on a loaded
        # machine where the two workers start far apart: with too few, the other worker
        # finishes everything first and the master rightly relaunches nobody.
        f"--num_epochs={EPOCHS}",
        "--evaluation_steps=48",
        "--num_workers=2",
        "--num_ps_pods=1",
        "--master_resource_request=cpu=0.1,memory=256Mi",
        "--worker_resource_request=cpu=0.1,memory=512Mi",
        "--ps_resource_request=cpu=0.1,memory=256Mi",
    ]
    backend, _ = submit_train(kubelet, ns, flags)
    worker0 = f"elasticdl-{JOB}-worker-0"

    def diagnose() -> str:
        pods = [(p.metadata.name, p.status.phase) for p in k8s.list_pods()]
        logs = []
        for name, _ in pods:
            path = kubelet.log_path(ns, name)
            if path.exists():
                logs.append(f"--- {name} ---\n" + path.read_text(errors="replace")[-2500:])
        return f"pods: {pods}\n" + "\n".join(logs)

    # The master created the PS (+ its service) and the workers, all owned by the master pod.
    master = wait_for(lambda: k8s.get_pod(f"elasticdl-{JOB}-master"), 30, "the master pod")

    def worker0_running() -> bool:
        if k8s.get_pod(f"elasticdl-{JOB}-master").status.phase == "Failed":
            pytest.fail(f"the master failed\n{diagnose()}")
        pod = k8s.get_pod(worker0)
        return pod is not None and pod.status.phase == "Running"

    wait_for(worker0_running, 180, "worker-0 to run", diagnose)
    assert k8s.get_service(f"elasticdl-{JOB}-ps-0") is not None
    assert k8s.get_pod(worker0).metadata.owner_references[0].uid == master.metadata.uid

    # Let worker-0 train a little, then delete its pod (like kubectl delete / preemption). The
    # other worker may train most of the job while worker-0 still starts, and a job with no work
    # left replaces no worker: delete it by a third of the job even if it has no task yet.
    def worker0_trains_or_a_third_done() -> bool:
        took_task = "task" in kubelet.log_path(ns, worker0).read_text(errors="replace").lower()
        return took_task or backend.status(JOB).records_trained >= EPOCHS * 192 // 3

    wait_for(worker0_trains_or_a_third_done, 180, "worker-0 to take a task", diagnose)
    assert k8s.delete_pod(worker0)
    at_delete = backend.status(JOB)

    target = ["--platform=kubernetes", f"--namespace={ns}"]
    assert main(["status", JOB, *target]) == 0
    assert main(["wait", JOB, "--timeout=600", *target]) == 0  # 0: Succeeded
    final = backend.status(JOB)
    master_log = "".join(backend.logs(JOB))
    assert final.phase == "Succeeded", master_log[-3000:]
    total = EPOCHS * 192
    assert f"trained {total}/{total} records" in master_log  # nothing lost
    assert "Evaluation metrics[v=" in master_log and "'accuracy'" in master_log
    # The master published its status on its pod: worker-0 was deleted and replaced by worker-2.
    replicas = {r.name: r for r in final.replicas}
    assert replicas["worker-0"].phase == "Deleted", replicas
    about_worker0 = [line for line in master_log.splitlines() if "orker 0" in line]
    assert "worker-2" in replicas, (
        f"{at_delete.records_trained}/{total} records trained when worker-0 was deleted",
        sorted(replicas),
        about_worker0,
        master_log[-1500:],
    )
    assert final.records_trained == final.records_expected == total
    # The dashboard's curves (GET /v1/jobs/{name}/metrics) from what the master published:
    # a loss per task and the evaluations, over rising model versions.
    curves = MetricsHistory.of(final)
    versions = [point["model_version"] for point in curves.loss]
    assert len(versions) >= 20 and versions == sorted(versions) and versions[-1] > 0, curves
    assert curves.evaluation and "accuracy" in curves.evaluation[-1]["metrics"], curves

    # Cancel of a finished job removes it and everything it owned.
    assert backend.cancel(JOB).phase == "Succeeded"
    assert k8s.list_pods() == [] and k8s.list_services() == []


def _records(directory: Path, count: int) -> str:
    """A RecordIO file of ``count`` records: the master only counts them into tasks."""
    from elasticdl.data.recordio import Writer

    directory.mkdir()
    with Writer(str(directory / "data-00000.rio")) as w:
        for i in range(count):
            w.write(b"record-%d" % i)
    return str(directory)


def test_master_creates_worker_pods_with_the_priority_split(k8s_cluster, k8s, namespace, tmp_path):
    """--worker_pod_priority=<fraction>: the real master (``Job`` in this process) creates its
    worker pods through the API server; the share the original ElasticDL made high
    (ceil(fraction x workers), from both ends of the id range in turn) carries
    ElasticDL's class elasticdl-high, the rest elasticdl-low, and Priority admission resolves
    each class. No
    kubelet serves this namespace: only the pod specs matter."""
    import mnist.mnist_functional_api
    from elasticdl.common.job_spec import spec_from_values
    from elasticdl.k8s.names import LABEL_REPLICA_INDEX, LABEL_REPLICA_TYPE
    from elasticdl.k8s.pods import PodTemplate
    from elasticdl.master.job import Job
    from elasticdl.platform.kubernetes import NETWORK_HOST, KubernetesPlatform
    from elasticdl.platform.local import pick_free_port

    zoo = Path(mnist.mnist_functional_api.__file__).resolve().parent.parent
    spec, _ = spec_from_values(
        "train",
        {
            "job_name": "k8s-prio",
            "image_name": "local/elasticdl:test",
            "platform": "kubernetes",
            "namespace": namespace,
            "model_zoo": str(zoo),
            "model_def": "mnist.mnist_functional_api.custom_model",
            "training_data": _records(tmp_path / "train", 64),
            "num_workers": 5,
            "num_ps_pods": 1,
            "worker_pod_priority": "0.5",
            "ps_pod_priority": "high",
            "port": pick_free_port(),
        },
    ).resolve(check_local_paths=False)
    platform = KubernetesPlatform(
        job_name=spec.job_name,
        k8s=k8s,
        image=spec.image_name,
        template=PodTemplate.from_spec(spec),
        network=NETWORK_HOST,
    )
    job = Job(spec, platform=platform)
    runner = threading.Thread(target=job.run, daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            workers = {
                p.metadata.labels[LABEL_REPLICA_INDEX]: p
                for p in k8s.list_pods()
                if p.metadata.labels.get(LABEL_REPLICA_TYPE) == "worker"
            }
            if len(workers) == 5 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        classes = {int(i): p.spec.priority_class_name for i, p in workers.items()}
        # ceil(0.5 x 5) = 3 high: workers 0, 4 and 1 (both ends in turn), 2 and 3 low.
        high, low = "elasticdl-high", "elasticdl-low"
        assert classes == {0: high, 1: high, 2: low, 3: low, 4: high}, classes
        values = {int(i): p.spec.priority for i, p in workers.items()}
        assert values == {0: 0, 1: 0, 2: -100, 3: -100, 4: 0}, values
        (ps,) = [p for p in k8s.list_pods() if p.metadata.labels.get(LABEL_REPLICA_TYPE) == "ps"]
        assert ps.spec.priority_class_name == high
    finally:
        job.cancel()
        runner.join(timeout=60)
    assert not runner.is_alive()
    assert job.phase == "Cancelled"
