"""A REAL single-node Kubernetes cluster for tests: ``scripts/k8s/start-node.sh`` (etcd,
kube-apiserver, controller-manager, scheduler, a real kubelet with its dockershim, a private
Docker engine and a local registry, all on loopback).

Pants runs test files in parallel processes; they all share ONE node: each holds a shared
``flock`` on ``<node dir>/users.lock`` while it runs and whoever leaves last (gets the
exclusive lock) stops the node -- if the tests started it (a node a developer started stays up).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 1500  # a fresh machine builds kubelet + scheduler first (build-node.sh)
STARTED_MARKER = "started-by-tests"
REQUIRE_ENV = "ELASTICDL_REQUIRE_K8S_NODE"


class NodeUnavailable(RuntimeError):
    pass


def repo_root() -> Path:
    """The directory holding scripts/k8s (the checkout, or Pants' sandbox)."""
    here = Path(__file__).resolve()
    for parent in [Path.cwd(), *here.parents]:
        if (parent / "scripts" / "k8s" / "start-node.sh").is_file():
            return parent
    raise FileNotFoundError("scripts/k8s/start-node.sh not found above " + str(here))


def node_dir() -> Path:
    return Path(os.environ.get("ELASTICDL_NODE_DIR", "/tmp/elasticdl-node"))


def bin_dir() -> Path:
    if os.environ.get("ELASTICDL_K8S_BIN"):
        return Path(os.environ["ELASTICDL_K8S_BIN"])
    cache = os.environ.get("ELASTICDL_K8S_CACHE") or os.path.expanduser(
        "~/.cache/elasticdl/k8s-1.20.2"
    )
    return Path(cache) / "bin"


NODE_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kubectl",
    "busybox",
)


def why_not_here() -> str:
    """Why this machine cannot run the node ('' when it can, binaries aside)."""
    if os.geteuid() != 0:
        return "the real node needs root (dockerd, kubelet, cgroups)"
    if not os.path.isdir("/sys/fs/cgroup/memory"):
        return "the real node needs cgroup v1 (kubelet 1.20's dockershim); /sys/fs/cgroup/memory is missing"
    if not shutil.which("dockerd") and not shutil.which("apt-get"):
        return "neither dockerd nor apt-get (to install docker.io) is available"
    for tool in ("openssl", "ip", "curl"):
        if not shutil.which(tool):
            return f"{tool} is not installed"
    return ""


def missing_binaries() -> list[str]:
    return [b for b in NODE_BINARIES if not os.access(bin_dir() / b, os.X_OK)]


@dataclass
class Node:
    kubeconfig: str
    docker_host: str
    registry: str
    api: str
    bin_dir: Path
    state_dir: Path
    start_seconds: float

    def api_client(self):
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=self.kubeconfig, client_configuration=cfg)
        return client.ApiClient(cfg)

    def kubectl(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        r = subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and r.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def docker(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        cli = "/usr/bin/docker" if os.access("/usr/bin/docker", os.X_OK) else "docker"
        r = subprocess.run(
            [cli, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "DOCKER_HOST": self.docker_host},
        )
        if check and r.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout


def _node_pids() -> list[int]:
    """The pids start-node.sh recorded for the node's processes."""
    pids = []
    for f in (node_dir() / "run").glob("*.pid"):
        try:
            pids.append(int(f.read_text().strip()))
        except (OSError, ValueError):
            pass
    return pids


class NodeLease:
    """Start (or join) the node; ``release()`` stops it when no other user remains."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self.node: Node | None = None

    def acquire(self) -> Node:
        reason = why_not_here()
        if reason:
            raise NodeUnavailable(reason)
        d = node_dir()
        d.mkdir(parents=True, exist_ok=True)
        # Shared lock first, so that a user finishing meanwhile does not stop our node.
        self._fd = os.open(d / "users.lock", os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_SH)
        script = repo_root() / "scripts" / "k8s" / "start-node.sh"
        env = {**os.environ, "ELASTICDL_NODE_DIR": str(d)}
        # Concurrent starters (parallel test files) take turns; start is idempotent.
        with open(d / "start.lock", "w") as start_lock:
            fcntl.flock(start_lock, fcntl.LOCK_EX)
            up = subprocess.run(["bash", str(script), "status"], capture_output=True, env=env)
            t0 = time.monotonic()
            r = subprocess.run(
                ["bash", str(script), "start"],
                capture_output=True,
                text=True,
                timeout=START_TIMEOUT_S,
                env=env,
            )
            seconds = time.monotonic() - t0
            if r.returncode != 0:
                self.release(stop=False)
                errors = [ln for ln in r.stderr.splitlines() if "error" in ln.lower()]
                tail = (errors or r.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise NodeUnavailable(f"start-node.sh failed (exit {r.returncode}): {tail}")
            if up.returncode != 0:
                # Not (fully) up before: the tests started it, so the tests stop it.
                (d / STARTED_MARKER).touch()
        values = dict(
            line.split("=", 1) for line in r.stdout.splitlines() if "=" in line and " " not in line
        )
        self.node = Node(
            kubeconfig=values["KUBECONFIG"],
            docker_host=values["DOCKER_HOST"],
            registry=values["ELASTICDL_NODE_REGISTRY"],
            api=values["ELASTICDL_NODE_API"],
            bin_dir=bin_dir(),
            state_dir=d,
            start_seconds=seconds,
        )
        return self.node

    def release(self, stop: bool = True) -> None:
        if self._fd is None:
            return
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        try:
            if stop:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return  # another test process still uses the node; it stops it
                marker = node_dir() / STARTED_MARKER
                if not marker.exists():
                    return
                marker.unlink()
                pids = _node_pids()
                r = subprocess.run(
                    ["bash", str(repo_root() / "scripts" / "k8s" / "start-node.sh"), "stop"],
                    capture_output=True,
                    text=True,
                    timeout=180,
                    env={**os.environ, "ELASTICDL_NODE_DIR": str(node_dir())},
                )
                # Nothing of the node may be left: no process, no mount under its directory.
                left = [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
                with open("/proc/self/mounts") as f:
                    mounts = [ln.split()[1] for ln in f if f" {node_dir()}/" in ln]
                if r.returncode != 0 or left or mounts:
                    raise RuntimeError(
                        f"start-node.sh stop (exit {r.returncode}) left processes {left} and "
                        f"mounts {mounts}: {r.stderr.strip()[-500:]}"
                    )
        finally:
            os.close(self._fd)
            self._fd = None
