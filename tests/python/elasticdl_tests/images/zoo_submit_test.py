"""The on-prem cluster guide's ``elasticdl train --image_base=... --docker_image_prefix=...`` against a REAL
Docker engine and registry (see conftest): the client builds the model-zoo image at submit
time, pushes it to ``<prefix>elasticdl:<content tag>`` and submits with it. ``--yaml`` writes
the master pod instead of creating it (no cluster here; k8s_node/onprem_guide_test.py runs the
same command on the real node)."""

from __future__ import annotations

import json
import re
import urllib.request
import uuid

import yaml
from elasticdl.client import zoo  # noqa: F401  (the image code main runs by name)
from elasticdl.client.main import main

# The on-prem guide's spec.py: a label and a toleration on every pod, headless services.
SEED_SPEC = """
from kubernetes import client

class MyCluster:
    def __init__(self):
        self._pool = "elasticdl"
        self._app_name = "elasticdl"

    def with_pod(self, pod):
        pod.metadata.labels["my_app"] = self._app_name
        pod.spec.tolerations = [
            client.V1Toleration(
                effect="NoSchedule", key="mycluster.com/app-pool", operator="Equal",
                value=self._pool,
            ),
        ]
        return pod

    def with_service(self, service):
        service.spec.type = "ClusterIP"
        service.spec.cluster_ip = "None"
        return service

cluster = MyCluster()
"""


def _registry_tags(registry: str, repo: str) -> list[str]:
    with urllib.request.urlopen(f"http://{registry}/v2/{repo}/tags/list", timeout=10) as r:
        return json.load(r)["tags"] or []


def _master(path) -> dict:
    pod = yaml.safe_load(path.read_text())
    container = pod["spec"]["containers"][0]
    [arg] = [a for a in container["command"] if a.startswith("--job_spec=")]
    return {"pod": pod, "container": container, "spec": json.loads(arg.split("=", 1)[1])}


def _run(client, image: str, command: list[str]) -> str:
    container = client.create_container(image, command=command)
    try:
        client.start(container)
        status = client.wait(container, timeout=120)
        logs = client.logs(container).decode()
        assert status["StatusCode"] == 0, logs
        return logs
    finally:
        client.remove_container(container, force=True)


def test_image_base_builds_pushes_and_submits_with_the_image(
    docker_env, tmp_path, monkeypatch, capsys
):
    token = uuid.uuid4().hex[:12]
    zoo_dir = tmp_path / "model_zoo"
    (zoo_dir / "mnist").mkdir(parents=True)
    (zoo_dir / "mnist" / "mnist_functional_api.py").write_text(f"TOKEN = {token!r}\n")
    spec_py = tmp_path / "spec.py"
    spec_py.write_text(SEED_SPEC)
    repo = f"elasticdl-test/submit-{token}"
    argv = [
        "train",
        f"--image_base={docker_env.base_image}",
        f"--docker_image_prefix={docker_env.registry}/{repo}/",
        "--model_zoo=./model_zoo",
        "--model_def=mnist.mnist_functional_api.custom_model",
        "--training_data=/data/mnist/train",
        "--job_name=test-mnist",
        "--checkpoint_steps=10",
        "--cluster_spec=spec.py",
        "--image_pull_policy=Always",
        f"--yaml={tmp_path / 'master.yaml'}",
    ]
    monkeypatch.chdir(tmp_path)
    client = docker_env.client()
    made = []
    try:
        assert main(argv) == 0, capsys.readouterr().err
        err = capsys.readouterr().err
        assert re.search(r"\[1/\d+\] FROM ", err), err  # zoo build's progress
        assert re.search(r"built \S+/elasticdl:[0-9a-f]{16} on ", err), err
        assert re.search(r"pushed \S+ in [0-9.]+s \(\d+ layers uploaded", err), err
        assert "checkpoint_dir: /tmp/elasticdl/checkpoint_dir in the PS pods" in err, err
        master = _master(tmp_path / "master.yaml")
        image = master["container"]["image"]
        made.append(image)
        assert re.fullmatch(
            rf"{re.escape(docker_env.registry)}/{repo}/elasticdl:[0-9a-f]{{16}}", image
        )
        assert _registry_tags(docker_env.registry, f"{repo}/elasticdl") == [image.rsplit(":", 1)[1]]
        assert master["container"]["imagePullPolicy"] == "Always"
        sent = master["spec"]
        assert sent["image_name"] == image and sent["model_zoo"] == "/model_zoo"
        assert sent["checkpoint_dir"] == "/tmp/elasticdl/checkpoint_dir"
        assert "image_base" not in sent and "docker_image_prefix" not in sent
        # The on-prem guide's cluster spec on the master pod (the master applies it to the others).
        assert master["pod"]["metadata"]["labels"]["my_app"] == "elasticdl"
        assert master["pod"]["spec"]["tolerations"][0]["key"] == "mycluster.com/app-pool"
        # The image holds the zoo where the job looks and the spec where the master looks.
        listing = _run(
            client,
            image,
            ["sh", "-c", "cat /model_zoo/mnist/mnist_functional_api.py; ls /cluster_spec"],
        )
        assert token in listing and "spec.py" in listing

        # The same zoo again: the same image, no build, a push that uploads nothing.
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert f"{image} is up to date" in err and "0 layers uploaded" in err, err
        assert _master(tmp_path / "master.yaml")["container"]["image"] == image

        # Without --docker_image_prefix: built for this engine only, never pulled.
        local = [a for a in argv if not a.startswith("--docker_image_prefix")]
        assert main(local) == 0
        err = capsys.readouterr().err
        master = _master(tmp_path / "master.yaml")
        made.append(master["container"]["image"])
        assert master["container"]["image"] == "elasticdl:" + image.rsplit(":", 1)[1]
        assert master["container"]["imagePullPolicy"] == "IfNotPresent"
        assert "elasticdl: pushed" not in err and "image_pull_policy: IfNotPresent" in err, err
    finally:
        for name in made:
            try:
                client.remove_image(name, force=True)
            except Exception:
                pass
