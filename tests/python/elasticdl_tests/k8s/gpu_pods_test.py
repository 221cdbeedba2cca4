"""A GPU job on Kubernetes: a zoo image made by ``elasticdl zoo init --base_image=elasticdl:gpu``
and ``elasticdl train --worker_resource_request=...,gpu=1``. The master (a real process, run by
the stand-in kubelet) creates the worker pods through the real API server: each must run the
job's image and have ``nvidia.com/gpu: 1`` in its limits (and requests), the PS none.

FAKE: the kubelet (``process_kubelet``) runs pods as local processes whatever they request; with
no scheduler and no NVIDIA device plugin here, nothing checks that a GPU exists. (On the real
node such a worker stays Pending, Unschedulable: k8s_node/gpu_pending_test.py.)
"""

from __future__ import annotations

import time

import pytest
from elasticdl.client import (  # noqa: F401  (main imports it by name; this makes it a dependency)
    zoo,
)
from elasticdl_tests.k8s.kubelet_jobs import submit_train

pytest.importorskip("tensorflow")
pytest.importorskip("elasticdl.master.main")

JOB = "k8s-gpu"
ZOO_IMAGE = "127.0.0.1:5000/elasticdl-zoo:gpu"  # what `zoo build` would tag; never pulled here


def test_gpu_workers_request_nvidia_gpu_and_run_the_zoo_image(
    k8s_cluster, served_namespace, kubelet, k8s, tmp_path, monkeypatch
):
    import mnist.mnist_functional_api
    from elasticdl.client.main import main
    from elasticdl.data.datasets import prepare

    zoo_dir = mnist.mnist_functional_api.__file__.rsplit("/", 2)[0]
    monkeypatch.setenv("KUBECONFIG", str(k8s_cluster.kubeconfig))
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ELASTICDL_CONFIG", raising=False)

    # The zoo image's Dockerfile starts from the GPU base image.
    ctx = tmp_path / "ctx"
    (ctx / "zoo").mkdir(parents=True)
    with monkeypatch.context() as m:
        # Back after it: the kubelet makes the (under Pants relative) sys.path absolute.
        m.chdir(ctx)
        assert main(["zoo", "init", "--base_image=elasticdl:gpu", "--model_zoo=zoo"]) == 0
    assert (ctx / "Dockerfile").read_text().splitlines()[1] == "FROM elasticdl:gpu"

    data = tmp_path / "data"
    prepare("fashion_mnist", str(data), progress=False, limit=256)
    ns = served_namespace
    flags = [
        f"--job_name={JOB}",
        f"--image_name={ZOO_IMAGE}",
        f"--model_zoo={zoo_dir}",
        "--model_def=mnist.mnist_functional_api.custom_model",
        f"--training_data={data}/train",
        "--minibatch_size=16",
        "--num_epochs=50",  # still training when the test has looked at the pods
        "--num_workers=2",
        "--num_ps_pods=1",
        "--master_resource_request=cpu=0.1,memory=256Mi",
        "--worker_resource_request=cpu=0.1,memory=512Mi,gpu=1",
        "--ps_resource_request=cpu=0.1,memory=256Mi",
    ]
    backend, _ = submit_train(kubelet, ns, flags)
    try:
        names = [f"elasticdl-{JOB}-worker-{i}" for i in range(2)]
        deadline = time.monotonic() + 120
        while not all(k8s.get_pod(n) for n in names):
            master = k8s.get_pod(f"elasticdl-{JOB}-master")
            if master is not None and master.status.phase == "Failed":
                log = kubelet.log_path(ns, master.metadata.name).read_text(errors="replace")
                pytest.fail(f"the master failed:\n{log[-3000:]}")
            assert time.monotonic() < deadline, [p.metadata.name for p in k8s.list_pods()]
            time.sleep(0.3)

        for name in names:
            (container,) = k8s.get_pod(name).spec.containers
            assert container.image == ZOO_IMAGE
            assert container.resources.limits["nvidia.com/gpu"] == "1"
            assert container.resources.requests["nvidia.com/gpu"] == "1"
        master = k8s.get_pod(f"elasticdl-{JOB}-master").spec.containers[0]
        ps = k8s.get_pod(f"elasticdl-{JOB}-ps-0").spec.containers[0]
        for other in (master, ps):
            assert other.image == ZOO_IMAGE
            assert "nvidia.com/gpu" not in (other.resources.limits or {})
    finally:
        backend.cancel(JOB)
    # The master's deletion takes the pods it owns with it (the garbage collector).
    deadline = time.monotonic() + 60
    while k8s.list_pods() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert k8s.list_pods() == []
