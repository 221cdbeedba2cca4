"""What the real-node benchmarks share: the node, a namespace the job may run in, the job's
image, and the client.

The node is the one ``scripts/k8s/start-node.sh start`` runs: started if needed and never
stopped (other users may share it). While a benchmark runs it holds the shared lock the tests'
lease takes (``tests/python/elasticdl_tests/k8s_node/node.py``), so a test session that started
the node and ends meanwhile leaves it up -- unless ``ELASTICDL_NODE_HELD_BY_CALLER`` is set: a
test that holds the cluster runs the benchmark.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]
for _path in (REPO / "model_zoo", REPO / "src" / "python"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

MODEL_DEF = "mnist.mnist_functional_api.custom_model"
# Held for the life of the process (see the module docstring).
_users_lock: int | None = None


def node_env(tool: str) -> dict[str, str]:
    """KUBECONFIG, DOCKER_HOST, ELASTICDL_NODE_REGISTRY and ELASTICDL_NODE_API of the node."""
    global _users_lock
    node_dir = Path(os.environ.get("ELASTICDL_NODE_DIR", "/tmp/elasticdl-node"))
    node_dir.mkdir(parents=True, exist_ok=True)
    # A test that holds the cluster alone (its exclusive lock) runs a benchmark in a child
    # process: the child's shared lock would wait for its own parent.
    if _users_lock is None and not os.environ.get("ELASTICDL_NODE_HELD_BY_CALLER"):
        _users_lock = os.open(node_dir / "users.lock", os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(_users_lock, fcntl.LOCK_SH)
    r = subprocess.run(
        ["bash", str(REPO / "scripts" / "k8s" / "start-node.sh"), "start"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if r.returncode != 0:
        sys.exit(f"{tool}: start-node.sh start failed: {r.stderr.strip()[-300:]}")
    return dict(ln.split("=", 1) for ln in r.stdout.splitlines() if "=" in ln and " " not in ln)


def kubectl() -> str:
    cache = os.environ.get("ELASTICDL_K8S_CACHE") or os.path.expanduser(
        "~/.cache/elasticdl/k8s-1.20.2"
    )
    return os.environ.get("ELASTICDL_K8S_BIN", os.path.join(cache, "bin")) + "/kubectl"


def cli(tool: str, *argv: str) -> str:
    """``elasticdl ARGV`` in this process; its stdout. Exits with its error if it fails."""
    from elasticdl.client.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    if rc != 0:
        sys.exit(f"{tool}: elasticdl {argv[0]} failed: {err.getvalue().strip()[-500:]}")
    return out.getvalue()


def make_readable(*roots: Path) -> None:
    """The pods run as user 10001 and a hostPath keeps its owner and mode."""
    for root in roots:
        for path in [root, *root.rglob("*")]:
            path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))


@contextlib.contextmanager
def namespace(tool: str, env: dict[str, str]) -> Iterator[tuple[object, str]]:
    """A fresh namespace with the master's RBAC, ready for pods: (CoreV1Api, name). Deleted,
    with everything in it, on the way out."""
    from kubernetes import client, config

    os.environ.update(KUBECONFIG=env["KUBECONFIG"], DOCKER_HOST=env["DOCKER_HOST"])
    config.load_kube_config(config_file=env["KUBECONFIG"])
    core = client.CoreV1Api()
    name = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        manifest = cli(tool, "rbac", f"--namespace={name}")
        subprocess.run(
            [kubectl(), f"--kubeconfig={env['KUBECONFIG']}", "apply", "-f", "-"],
            input=manifest,
            text=True,
            check=True,
            capture_output=True,
        )
        # Pods are refused until the token controller gave the default account its token.
        while not any(
            sa.secrets
            for sa in core.list_namespaced_service_account(
                name, field_selector="metadata.name=default"
            ).items
        ):
            time.sleep(0.1)
        yield core, name
    finally:
        core.delete_namespace(name, grace_period_seconds=0)


def build_mnist_image(env: dict[str, str], image_base: str, work: Path) -> tuple[str, Path]:
    """The job's image from ``image_base`` and a zoo holding model_zoo/mnist, as ``train
    --image_base`` builds it: (image name, the zoo directory)."""
    return build_zoo_image(env, image_base, work, ("mnist",))


def build_zoo_image(
    env: dict[str, str], image_base: str, work: Path, models: tuple[str, ...]
) -> tuple[str, Path]:
    """The job's image from ``image_base`` and a zoo holding the ``models`` directories of
    model_zoo, as ``train --image_base`` builds it: (image name, the zoo directory)."""
    from elasticdl.client import zoo_image

    zoo = work / "zoo"
    for model in models:
        shutil.copytree(
            REPO / "model_zoo" / model,
            zoo / model,
            ignore=shutil.ignore_patterns("__pycache__", "BUILD", "*_test.py"),
        )
    request = zoo_image.ZooImageRequest(
        base_image=image_base, model_zoo=str(zoo), prefix=env["ELASTICDL_NODE_REGISTRY"]
    )
    with contextlib.redirect_stderr(io.StringIO()):
        return zoo_image.build_zoo_image(request).image, zoo


def node_job_argv(
    env: dict[str, str], image: str, namespace: str, volumes: str, network: str = "pod"
) -> list[str]:
    """The flags every benchmark job on the cluster gets: its image and namespace, the pods'
    resources (sized for the small nodes; the limit is the request), ``volumes`` (hostPath
    mounts) and its network: ``pod`` (the default mode: pod addresses, Service names) or
    ``host`` (the nodes' network, the API server on loopback)."""
    argv = [
        f"--image_name={image}",
        "--model_zoo=/model_zoo",
        f"--namespace={namespace}",
        "--image_pull_policy=IfNotPresent",
        f"--volume={volumes}",
        "--master_resource_request=cpu=0.2,memory=1024Mi",
        "--worker_resource_request=cpu=0.4,memory=1024Mi",
        "--ps_resource_request=cpu=0.2,memory=1024Mi",
    ]
    if network == "host":
        api_host, api_port = env["ELASTICDL_NODE_API"].rsplit(":", 1)
        argv.append(
            f"--envs=ELASTICDL_K8S_NETWORK=host,KUBERNETES_SERVICE_HOST={api_host},"
            f"KUBERNETES_SERVICE_PORT={api_port}"
        )
    elif network != "pod":
        raise ValueError(f"network {network!r}: use 'pod' or 'host'")
    return argv
