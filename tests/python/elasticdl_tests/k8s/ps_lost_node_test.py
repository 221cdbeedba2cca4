"""A PS on a lost node, on a real kube-apiserver: its relaunch waits for its old pod, and the
master goes on handling the other replicas meanwhile.

``elasticdl train --platform=kubernetes`` runs the master, one PS and two workers (the model
zoo's MNIST CNN on real Fashion-MNIST records). The PS's pod is then evicted as from a lost
node: the pod keeps a finalizer, so it stays ``Terminating`` as a pod on a node whose kubelet
is gone does, and the master reads the eviction from its Events and relaunches the PS under the
same name once the old pod is gone. While the old pod is held, a worker's pod is deleted: its
replacement is created at once, not after the PS's wait. Then the test removes the finalizer
(as the node controller finally removes such a pod): the PS comes back under its name, the
workers find it again and the job trains every record once.

Real: the client, master, PS and workers (TensorFlow), the API server, the garbage collector.
FAKE: the kubelet (``process_kubelet``): pods are local processes sharing 127.0.0.1
(``ELASTICDL_K8S_NETWORK=host`` addressing). The test STANDS IN FOR THE TAINT MANAGER and the
node controller, which this tier does not run: it records the ``TaintManagerEviction`` Event,
deletes the pod, and holds and releases the pod's removal with its own finalizer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from elasticdl_tests.k8s.disruptions_test import _record_event
from elasticdl_tests.k8s.e2e_test import _fashion_mnist_subset
from elasticdl_tests.k8s.kubelet_jobs import submit_train
from elasticdl_tests.waiting import wait_for

pytest.importorskip("tensorflow")
pytest.importorskip("elasticdl.master.main")
pytest.importorskip("elasticdl.worker.main")
pytest.importorskip("elasticdl.ps.main")

JOB = "k8s-ps-lost"
FINALIZER = "elasticdl.test/lost-node"
RECORDS, EPOCHS = 2 * 96, 8


def test_a_ps_held_terminating_holds_up_no_worker_relaunch(
    k8s_cluster, served_namespace, kubelet, k8s, tmp_path, monkeypatch
):
    import mnist.mnist_functional_api
    from elasticdl.client.main import main

    zoo = Path(mnist.mnist_functional_api.__file__).resolve().parent.parent
    monkeypatch.setenv("KUBECONFIG", str(k8s_cluster.kubeconfig))  # inherited by the master
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ELASTICDL_CONFIG", raising=False)
    ns = served_namespace
    flags = [
        f"--job_name={JOB}",
        "--image_name=local/elasticdl:test",
        f"--model_zoo={zoo}",
        "--model_def=mnist.mnist_functional_api.custom_model",
        f"--training_data={_fashion_mnist_subset(tmp_path / 'train', 'train', 2, 96)}",
        "--minibatch_size=16",
        "--num_minibatches_per_task=1",
        # Work is left when the PS is evicted: training stops while it is away.
        f"--num_epochs={EPOCHS}",
        "--num_workers=2",
        "--num_ps_pods=1",
        "--master_resource_request=cpu=0.1,memory=256Mi",
        "--worker_resource_request=cpu=0.1,memory=512Mi",
        "--ps_resource_request=cpu=0.1,memory=256Mi",
    ]
    backend, _ = submit_train(kubelet, ns, flags)
    master, ps0 = f"elasticdl-{JOB}-master", f"elasticdl-{JOB}-ps-0"
    worker0, worker2 = f"elasticdl-{JOB}-worker-0", f"elasticdl-{JOB}-worker-2"

    def log(name: str) -> str:
        path = kubelet.log_path(ns, name)
        return path.read_text(errors="replace") if path.exists() else ""

    def diagnose() -> str:
        pods = [
            (p.metadata.name, p.status.phase, bool(p.metadata.deletion_timestamp))
            for p in k8s.list_pods()
        ]
        logs = [f"--- {p[0]} ---\n{log(p[0])[-2500:]}" for p in pods]
        return f"pods: {pods}\n" + "\n".join(logs)

    def running(name: str) -> bool:
        if "Job failed" in log(master):
            pytest.fail(f"the master failed\n{diagnose()}")
        pod = k8s.get_pod(name)
        return pod is not None and pod.status.phase == "Running"

    # The PS is evicted as soon as training is under way (its model pushed) and worker 0's pod
    # runs, not after worker 0's first task: one worker can train every epoch while the other
    # still imports TensorFlow, and a job that is done has no worker to replace.
    wait_for(lambda: running(worker0), 180, "worker-0 to run", diagnose)
    wait_for(lambda: "initialised at version" in log(ps0), 180, "the PS's model", diagnose)
    old = k8s.get_pod(ps0)
    assert old.status.phase == "Running"
    assert "Training done" not in log(master), diagnose()
    try:
        # PS 0's node is lost: the taint manager records the eviction and deletes the pod,
        # which stays Terminating.
        k8s.core.patch_namespaced_pod(ps0, ns, {"metadata": {"finalizers": [FINALIZER]}})
        _record_event(
            k8s,
            old,
            "TaintManagerEviction",
            f"Marking for deletion Pod {ns}/{ps0}",
            "taint-controller",
        )
        assert k8s.delete_pod(ps0)
        wait_for(lambda: "Relaunching PS 0" in log(master), 60, "the PS's relaunch", diagnose)

        # Meanwhile worker 0 is deleted: replaced while the PS's old pod is still held.
        assert k8s.delete_pod(worker0)
        wait_for(lambda: k8s.get_pod(worker2), 60, "worker-0's replacement", diagnose)
        held = k8s.get_pod(ps0)
        assert held.metadata.uid == old.metadata.uid and held.metadata.deletion_timestamp
    finally:  # the node controller removes the lost node's pod
        if k8s.get_pod(ps0) is not None:
            k8s.core.patch_namespaced_pod(ps0, ns, {"metadata": {"finalizers": None}})

    def new_ps_running():
        pod = k8s.get_pod(ps0)
        return pod is not None and pod.metadata.uid != old.metadata.uid and running(ps0)

    wait_for(new_ps_running, 120, "PS 0 back under its name", diagnose)

    target = ["--platform=kubernetes", f"--namespace={ns}"]
    assert main(["wait", JOB, "--timeout=600", *target]) == 0, diagnose()
    final = backend.status(JOB)
    master_log = "".join(backend.logs(JOB))
    assert final.phase == "Succeeded", master_log[-3000:]
    assert f"trained {RECORDS * EPOCHS}/{RECORDS * EPOCHS} records" in master_log
    assert final.records_trained == final.records_expected == RECORDS * EPOCHS
    replicas = {r.name: r for r in final.replicas}
    assert "worker-2" in replicas and replicas["worker-0"].phase == "Deleted", replicas
    assert master_log.count("Relaunching PS 0") == 1, master_log[-3000:]
    assert "Evicted" in master_log, master_log[-3000:]
    backend.cancel(JOB)
