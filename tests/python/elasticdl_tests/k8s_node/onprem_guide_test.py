"""The on-prem cluster guide ("ElasticDL on On-prem Cluster") as written, on the REAL cluster:

``elasticdl train --image_base=elasticdl:cpu --docker_image_prefix=<node registry>/
--model_zoo=./model_zoo --checkpoint_steps=10 --image_pull_policy=Always --cluster_spec=spec.py
...`` builds the model-zoo image at submit time on the base image, pushes it to the node's
registry as ``<registry>/elasticdl:<content tag>``, and the job runs in real containers with the
guide's spec.py applied to every pod (its label and toleration are on the running master, PS and
worker pods). Then the same zoo again is no build and a push that uploads nothing, and the
guide's pre-built form (``--image_base=<that image> --model_zoo=/model_zoo``) is submitted
without building.

Differences from the guide's text, to fit a small test cluster: 1 worker and
``--grads_to_wait=1`` (the guide has 2 workers and 2), smaller resource requests, the data on a
hostPath volume, a tiny Fashion-MNIST subset and 1 epoch. The network is the default pod mode,
as on the guide's cluster.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from pathlib import Path

import pytest
from elasticdl.client import zoo_image
from elasticdl.client.main import main
from elasticdl.data.datasets import prepare
from elasticdl_tests.k8s_node.node import repo_root

TRAIN_RECORDS = 256
TEST_RECORDS = 64
MINIBATCH = 64

# The on-prem guide's spec.py, verbatim but for layout.
SEED_SPEC = """
from kubernetes import client

class MyCluster:
    def __init__(self):
        self._pool = "elasticdl"
        self._app_name = "elasticdl"

    # Add pod specifications
    def with_pod(self, pod):
        # Add a label
        pod.metadata.labels["my_app"] = self._app_name

        # Add tolerations
        tolerations = [
            client.V1Toleration(
                effect="NoSchedule",
                key="mycluster.com/app-pool",
                operator="Equal",
                value=self._pool ,
            ),
        ]
        pod.spec.tolerations = tolerations
        return pod

    # Add service specifications
    def with_service(self, service):
        # Use ClusterIP
        service.spec.type = "ClusterIP"
        service.spec.cluster_ip = "None"
        return service

cluster = MyCluster()
"""


@pytest.fixture
def client_env(k8s_node, tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", k8s_node.kubeconfig)
    monkeypatch.setenv("DOCKER_HOST", k8s_node.docker_host)
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path / "home"))
    for var in ("ELASTICDL_CONFIG", "ELASTICDL_K8S_POD_LOG_DIR", "DOCKER_TLS_VERIFY"):
        monkeypatch.delenv(var, raising=False)
    return k8s_node


def _data(root: Path) -> Path:
    data = root / "data"
    prepared = prepare(
        "fashion_mnist", str(data), progress=False, limit=TRAIN_RECORDS, records_per_shard=128
    )
    assert prepared.counts["train"] == TRAIN_RECORDS
    for path in [data, *data.rglob("*")]:  # the pods run as user 10001
        path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))
    return data


def _workdir(root: Path) -> Path:
    """The on-prem guide's working directory: ./model_zoo (with mnist) and spec.py."""
    work = root / "work"
    shutil.copytree(
        repo_root() / "model_zoo" / "mnist",
        work / "model_zoo" / "mnist",
        ignore=shutil.ignore_patterns("__pycache__", "BUILD", "*_test.py"),
    )
    (work / "spec.py").write_text(SEED_SPEC)
    return work


def _rbac(node, namespace: str, capsys) -> None:
    capsys.readouterr()
    assert main(["rbac", f"--namespace={namespace}"]) == 0
    path = node.state_dir / f"rbac-{namespace}.yaml"
    path.write_text(capsys.readouterr().out)
    try:
        node.kubectl("apply", "-f", str(path))
    finally:
        path.unlink()


def _seed_argv(image_flags: list[str], zoo: str, job: str, ns: str, data: Path):
    return [
        "train",
        *image_flags,
        f"--model_zoo={zoo}",
        "--model_def=mnist.mnist_functional_api.custom_model",
        "--training_data=/data/train",
        "--validation_data=/data/test",
        "--num_epochs=1",
        "--master_resource_request=cpu=0.2,memory=1024Mi,ephemeral-storage=500Mi",
        "--worker_resource_request=cpu=0.4,memory=1024Mi,ephemeral-storage=500Mi",
        "--ps_resource_request=cpu=0.2,memory=1024Mi",
        f"--minibatch_size={MINIBATCH}",
        "--num_minibatches_per_task=2",
        "--num_workers=1",
        "--checkpoint_steps=10",
        "--grads_to_wait=1",
        f"--job_name={job}",
        "--log_level=INFO",
        "--image_pull_policy=Always",
        f"--namespace={ns}",
        "--cluster_spec=spec.py",
        f"--volume=host_path={data},mount_path=/data",
        "--detach",
    ]


def _running_pods(k8s, job: str) -> dict:
    pods = {p.metadata.name: p for p in k8s.list_pods()}
    names = [f"elasticdl-{job}-{r}" for r in ("master", "ps-0", "worker-0")]
    if all(n in pods and pods[n].status.phase == "Running" for n in names):
        return {n: pods[n] for n in names}
    return {}


def test_seed_003_builds_pushes_and_runs_with_the_cluster_spec(
    base_image, client_env, node_namespace, node_k8s, tmp_path, monkeypatch, capsys
):
    node, ns = client_env, node_namespace
    base, _ = base_image
    data = _data(tmp_path)
    monkeypatch.chdir(_workdir(tmp_path))
    _rbac(node, ns, capsys)
    job = f"test-mnist-{uuid.uuid4().hex[:4]}"
    target = [f"--namespace={ns}", "--platform=kubernetes"]
    prefix = f"{node.registry}/"
    argv = _seed_argv(
        [f"--image_base={base}", f"--docker_image_prefix={prefix}"],
        "./model_zoo",
        job,
        ns,
        data,
    )
    t0 = time.monotonic()
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
    submit_s = time.monotonic() - t0
    err = capsys.readouterr().err
    built = re.search(rf"built ({re.escape(prefix)}elasticdl:[0-9a-f]{{16}}) on {base}", err)
    up_to_date = re.search(rf"({re.escape(prefix)}elasticdl:[0-9a-f]{{16}}) is up to date", err)
    assert built or up_to_date, err  # up to date: an earlier run built this zoo on this base
    image = (built or up_to_date).group(1)
    assert re.search(rf"pushed {re.escape(image)} in [0-9.]+s", err), err
    assert "checkpoint_dir: /tmp/elasticdl/checkpoint_dir in the PS pods" in err, err
    assert "lost with the pods" in err, err

    def diagnose() -> str:
        out = node.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False)
        for replica in ("master", "ps-0", "worker-0"):
            out += f"\n--- {replica} ---\n" + node.kubectl(
                "logs", "-n", ns, f"elasticdl-{job}-{replica}", "--tail=30", check=False
            )
        return out

    # The on-prem guide's spec.py on the running pods: the client patched the master, the master (from
    # /cluster_spec/spec.py in the image it was built into) the PS and the worker.
    deadline = time.monotonic() + 300
    running = {}
    while not running:
        running = _running_pods(node_k8s, job)
        if not running and main(["status", job, "-o", "json", *target]) == 0:
            phase = json.loads(capsys.readouterr().out)["phase"]
            assert phase in ("Pending", "Running"), f"job {phase} before its pods ran\n{diagnose()}"
        assert time.monotonic() < deadline, f"the job's pods never all ran\n{diagnose()}"
        time.sleep(0.5)
    for name, pod in running.items():
        assert pod.metadata.labels.get("my_app") == "elasticdl", (name, pod.metadata.labels)
        tolerations = {(t.key, t.operator, t.value, t.effect) for t in pod.spec.tolerations}
        guide = ("mycluster.com/app-pool", "Equal", "elasticdl", "NoSchedule")
        assert guide in tolerations, (name, tolerations)
        assert pod.spec.containers[0].image == image, name
        assert pod.spec.containers[0].image_pull_policy == "Always", name

    assert main(["wait", job, "--timeout=600", *target]) == 0, diagnose()
    job_s = time.monotonic() - t0
    capsys.readouterr()
    assert main(["status", job, "-o", "json", *target]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["phase"] == "Succeeded", status
    assert status["records_trained"] == status["records_expected"] == TRAIN_RECORDS, status
    assert main(["cancel", job, *target]) == 0

    # The same zoo on the same base: no build, and the push uploads nothing.
    request = zoo_image.ZooImageRequest(
        base_image=base, model_zoo="model_zoo", prefix=prefix, cluster_spec="spec.py"
    )
    again = zoo_image.build_zoo_image(request)
    assert (again.image, again.built, again.pushed, again.layers_uploaded) == (
        image,
        False,
        True,
        0,
    )

    # The on-prem guide's pre-built form: that image as it is, its zoo at /model_zoo; nothing is built.
    prebuilt = f"{job}-pre"
    argv = _seed_argv([f"--image_base={image}"], "/model_zoo", prebuilt, ns, data)
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
    err = capsys.readouterr().err
    assert f"image: {image} as it is" in err, err
    assert "elasticdl: built" not in err and "elasticdl: pushed" not in err, err
    assert main(["wait", prebuilt, "--timeout=600", *target]) == 0, diagnose()
    capsys.readouterr()
    assert main(["status", prebuilt, "-o", "json", *target]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["phase"] == "Succeeded", status
    assert status["records_trained"] == TRAIN_RECORDS, status
    pods = node_k8s.list_pods()
    assert pods and all(p.spec.containers[0].image == image for p in pods), pods
    assert main(["cancel", prebuilt, *target]) == 0
    node.docker("rmi", "-f", image, check=False)
    with capsys.disabled():
        print(
            f"\non-prem guide on the real cluster: submit (build + push) {submit_s:.1f}s, "
            f"submit -> Succeeded {job_s:.1f}s"
        )
