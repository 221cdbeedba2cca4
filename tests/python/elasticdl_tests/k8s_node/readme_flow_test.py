"""The README's "On this machine" Kubernetes block, run as written, line by line, by bash.

The block starts the cluster (``start-node.sh start``; it is running already, so start only
prints its ``KEY=value`` lines), builds the CPU base image and the model-zoo image, pushes it to
the cluster's registry, applies the master's RBAC, prepares 4096 Fashion-MNIST rows per split
in ``/tmp/fmnist``, trains in the default ``pod`` network mode with no override (the client
follows the master's log to the end), prints ``elasticdl status`` and stops the cluster. The
test checks what the block's comments promise: the job Succeeds with every record trained once
and an accuracy well above chance, and, read from the API while it trains (what ``kubectl get
pods -o wide`` in a second terminal shows), the master, ``ps-0`` and both workers Running on
their nodes' pod ranges with the workers on both nodes.

Where it runs: a directory laid out as a checkout (links to this checkout's top-level entries,
``dist`` the wheels the tests use, a copy of ``model_zoo`` because ``zoo init`` writes
``./Dockerfile`` there), so the block's relative paths are what a user's are and the checkout
is left as it was. ``elasticdl`` on ``PATH`` is this environment's client run by this
interpreter: the README names the PEX or the client wheel's console script, both this module.

The block needs the cluster alone (its last line stops it): ``exclusive_cluster``, which starts
it again for the other test files. ``/tmp/fmnist`` is the block's own path: the test refuses to
run where something is there already, and removes what the block made.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from elasticdl_tests.k8s_node import base_image as images
from elasticdl_tests.k8s_node.node import repo_root

HEADING = "On this machine"
JOB = "mnist-k8s"  # not the local quickstart's name: a user runs both, one after the other
DATA = Path("/tmp/fmnist")
RECORDS = 4096
BLOCK_TIMEOUT_S = 1500  # a cold node 2 pulls the 2.5 GB image from the registry


def readme_block(readme: Path) -> str:
    """The first ```bash block after the paragraph that begins with HEADING."""
    text = readme.read_text()
    at = text.index(f"\n{HEADING}")
    begin = text.index("```bash\n", at) + len("```bash\n")
    return text[begin : text.index("\n```", begin) + 1]


def _checkout_like(root: Path, wheels: str, where: Path) -> Path:
    where.mkdir()
    for entry in root.iterdir():
        if entry.name not in ("dist", "model_zoo") and not entry.name.startswith("."):
            (where / entry.name).symlink_to(entry)
    (where / "dist").symlink_to(Path(wheels).resolve())
    shutil.copytree(
        root / "model_zoo",
        where / "model_zoo",
        ignore=shutil.ignore_patterns("__pycache__", "BUILD", "*_test.py"),
    )
    return where


def _client_on_path(bin_dir: Path) -> dict[str, str]:
    bin_dir.mkdir()
    shim = bin_dir / "elasticdl"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m elasticdl.client "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    for var in ("KUBECONFIG", "DOCKER_HOST", "DOCKER_TLS_VERIFY", "ELASTICDL_CONFIG"):
        env.pop(var, None)  # the block's first line exports what it needs
    return env


class PodWatch:
    """Where the job's pods run while it trains: {pod: (node, pod IP, host network)} of every
    pod seen Running in the namespace ``default``."""

    def __init__(self, node) -> None:
        self.node = node
        self.running: dict[str, tuple[str, str, bool]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> "PodWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        from kubernetes import client

        api = client.CoreV1Api(self.node.api_client())
        while not self._stop.wait(0.5):
            try:
                pods = api.list_namespaced_pod("default", _request_timeout=5).items
            except Exception:  # the cluster is stopped at the block's end
                continue
            for pod in pods:
                if pod.status.phase == "Running" and pod.metadata.name.startswith(
                    f"elasticdl-{JOB}-"
                ):
                    self.running.setdefault(
                        pod.metadata.name,
                        (pod.spec.node_name, pod.status.pod_ip, bool(pod.spec.host_network)),
                    )


def test_the_readmes_kubernetes_block_as_written(exclusive_cluster, base_image, tmp_path):
    node = exclusive_cluster
    root = repo_root()
    if DATA.exists():
        pytest.fail(f"{DATA} exists: the README block prepares its data there; move it away")
    wheels = images.wheel_dir(root)
    assert wheels, "no wheels: set ELASTICDL_WHEEL_DIR (./pants package ...)"
    block = readme_block(root / "README.md")
    assert "ELASTICDL_K8S_NETWORK" not in block and "KUBERNETES_SERVICE" not in block, block
    prefix = node.range_prefix  # (read while the cluster runs)
    cwd = _checkout_like(root, wheels, tmp_path / "checkout")
    env = _client_on_path(tmp_path / "bin")
    try:
        with PodWatch(node) as watch:
            r = subprocess.run(
                ["bash", "-eo", "pipefail", "-c", block],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=BLOCK_TIMEOUT_S,
            )
    finally:
        shutil.rmtree(DATA, ignore_errors=True)
    out = r.stdout
    assert r.returncode == 0, f"{out[-3000:]}\n--- stderr ---\n{r.stderr[-5000:]}"

    # elasticdl train followed the master's log to the end.
    assert re.search(r"Evaluation metrics\[v=\d+\]: \{'accuracy'", out), out[-3000:]
    assert f"Job {JOB} succeeded: trained {RECORDS}/{RECORDS} records" in out, out[-3000:]
    # elasticdl status: Succeeded, every record, the test accuracy.
    assert re.search(r"^Phase:\s+Succeeded$", out, re.M), out[-2000:]
    assert re.search(rf"^Progress:\s+100% \({RECORDS}/{RECORDS} records\)$", out, re.M), out
    accuracy = float(re.search(r"^Evaluation:\s+accuracy=([0-9.]+)$", out, re.M).group(1))
    assert accuracy > 0.5, out[-2000:]  # 10 classes: chance is 0.1

    # While it trained: every pod on its node's pod range (pod network mode), workers on both.
    pods = [f"elasticdl-{JOB}-{r}" for r in ("master", "ps-0", "worker-0", "worker-1")]
    assert set(pods) <= set(watch.running), watch.running
    for pod in pods:
        node_name, ip, host_network = watch.running[pod]
        assert not host_network and ip.startswith(f"{prefix}.{node.nodes.index(node_name) + 1}.")
    assert {watch.running[p][0] for p in pods[2:]} == set(node.nodes[:2]), watch.running

    # The block's last line stopped the cluster (exclusive_cluster starts it again).
    status = subprocess.run(
        ["bash", str(root / "scripts" / "k8s" / "start-node.sh"), "status"],
        capture_output=True,
        env={**os.environ, "ELASTICDL_NODE_DIR": str(node.state_dir)},
    )
    assert status.returncode != 0, status.stdout
