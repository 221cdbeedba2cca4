"""A REAL multi-node Kubernetes cluster for tests: ``scripts/k8s/start-node.sh`` (etcd,
kube-apiserver, controller-manager, scheduler, kube-proxy, cluster DNS, a local registry, and
two nodes: each a real kubelet with its dockershim and a private Docker engine, pods on a CNI
pod network).

Pants runs test files in parallel processes; they all share ONE cluster: each holds a shared
``flock`` on ``<node dir>/users.lock`` while it runs and whoever leaves last (gets the
exclusive lock) stops the cluster -- if the tests started it (one a developer started stays
up). A test that takes the cluster from under its pods (a node loss, a stop) first turns its
shared lock into the exclusive one (:meth:`NodeLease.exclusive`): it waits until no other test
process uses the cluster, and other processes wait until it hands the cluster back whole.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

START_TIMEOUT_S = 1500  # a fresh machine builds the binaries first (build-node.sh)
STARTED_MARKER = "started-by-tests"
# "<prefix><pid>": a test process waits for the cluster alone; whoever leaves meanwhile does
# not stop it (the waiter is a user too, though it holds no lock while it waits).
EXCLUSIVE_WAITER = "exclusive-wanted."
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
    "kube-proxy",
    "kubectl",
    "busybox",
)


def why_not_here() -> str:
    """Why this machine cannot run the node ('' when it can, binaries aside)."""
    if os.geteuid() != 0:
        return "the real node needs root (dockerd, kubelet, cgroups)"
    if not os.path.isdir("/sys/fs/cgroup/memory"):
        return "the real node needs cgroup v1 (kubelet 1.20's dockershim); /sys/fs/cgroup/memory is missing"
    if not os.path.isdir("/sys/fs/cgroup/freezer"):
        return "the cluster needs the cgroup v1 freezer hierarchy (a node's processes are tracked in it)"
    if not shutil.which("dockerd") and not shutil.which("apt-get"):
        return "neither dockerd nor apt-get (to install docker.io) is available"
    for tool in ("openssl", "ip", "curl"):
        if not shutil.which(tool):
            return f"{tool} is not installed"
    return ""


def missing_binaries() -> list[str]:
    return [b for b in NODE_BINARIES if not os.access(bin_dir() / b, os.X_OK)]


def script_path() -> Path:
    return repo_root() / "scripts" / "k8s" / "start-node.sh"


def _docker_cli() -> str:
    return "/usr/bin/docker" if os.access("/usr/bin/docker", os.X_OK) else "docker"


@dataclass
class Node:
    """The cluster (the name is the tier's: it began as one node). ``docker_host`` is node 1's
    engine, where the tests build images; ``engines`` maps every node's name to its engine."""

    kubeconfig: str
    docker_host: str
    registry: str
    api: str
    bin_dir: Path
    state_dir: Path
    start_seconds: float
    engines: dict[str, str] = field(default_factory=dict)

    @property
    def nodes(self) -> list[str]:
        """The nodes' names (also their InternalIPs: 127.0.0.1, 127.0.0.2, ...), in order."""
        return list(self.engines)

    @property
    def cluster_address(self) -> str:
        """The apiserver's address in the cluster's range, the `kubernetes` Service's endpoint
        (``api`` is its loopback door on this machine)."""
        return self.kubectl(
            "get",
            "endpoints",
            "kubernetes",
            "-n",
            "default",
            "-o",
            "jsonpath={.subsets[0].addresses[0].ip}",
        ).strip()

    @property
    def range_prefix(self) -> str:
        """The cluster's /16 as "A.B" (start-node.sh: node i's pods in A.B.i.0/24)."""
        return self.cluster_address.rsplit(".", 2)[0]

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
        """``docker ARGS`` against node 1's engine (where images are built)."""
        return self.docker_on(self.docker_host, *args, check=check, timeout=timeout)

    def docker_on(self, where: str, *args: str, check: bool = True, timeout: float = 120) -> str:
        """``docker ARGS`` against the engine of node ``where`` (a node name or an engine)."""
        host = self.engines.get(where, where)
        r = subprocess.run(
            [_docker_cli(), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "DOCKER_HOST": host},
        )
        if check and r.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} (on {where}): {r.stderr.strip()}")
        return r.stdout

    def docker_each(self, *args: str, check: bool = True, timeout: float = 120) -> dict[str, str]:
        """``docker ARGS`` on every node's engine: {node name: output}."""
        return {n: self.docker_on(n, *args, check=check, timeout=timeout) for n in self.engines}

    def docker_any(self, *args: str, timeout: float = 120) -> str:
        """``docker ARGS`` on the engine where it succeeds, e.g. ``kill <container id>``: only
        the engine that runs the container knows it."""
        errors = []
        for n in self.engines:
            try:
                return self.docker_on(n, *args, timeout=timeout)
            except AssertionError as e:
                errors.append(str(e))
        raise AssertionError("; ".join(errors))

    def pull_everywhere(self, image: str, timeout: float = 900) -> None:
        """Pull a registry image into every engine but node 1's (where it was built), as an
        image pre-puller would: a pod then starts as fast on any node."""
        for n, host in self.engines.items():
            if host != self.docker_host:
                self.docker_on(n, "pull", "-q", image, timeout=timeout)

    def script(
        self, *args: str, timeout: float = 600, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        """``scripts/k8s/start-node.sh ARGS`` for this cluster, with ENV added to the
        environment (its output; exit status not checked)."""
        return subprocess.run(
            ["bash", str(script_path()), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {}), "ELASTICDL_NODE_DIR": str(self.state_dir)},
        )


def process_running(pid: int) -> bool:
    """A live process (a zombie -- dead, not yet reaped by its parent -- is not)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            state = next((ln.split()[1] for ln in f if ln.startswith("State:")), "")
    except OSError:
        return False
    return state not in ("", "Z")


def _exclusive_waiters() -> list[int]:
    """The live test processes waiting for the cluster alone."""
    pids = []
    for f in node_dir().glob(f"{EXCLUSIVE_WAITER}*"):
        pid = f.name[len(EXCLUSIVE_WAITER) :]
        if pid.isdigit() and process_running(int(pid)):
            pids.append(int(pid))
    return pids


def _node_pids() -> list[int]:
    """The pids start-node.sh recorded for the node's processes."""
    pids = []
    for f in (node_dir() / "run").glob("*.pid"):
        try:
            pids.append(int(f.read_text().strip()))
        except (OSError, ValueError):
            pass
    return pids


def parse_start_output(stdout: str, state_dir: Path, seconds: float) -> Node:
    """The Node from ``start-node.sh start``'s KEY=value lines (``ELASTICDL_NODE_<i>`` is
    ``<node name>,<its engine>``)."""
    values = dict(
        line.split("=", 1) for line in stdout.splitlines() if "=" in line and " " not in line
    )
    engines = {}
    for i in range(1, 10):
        if f"ELASTICDL_NODE_{i}" in values:
            name, engine = values[f"ELASTICDL_NODE_{i}"].split(",", 1)
            engines[name] = engine
    return Node(
        kubeconfig=values["KUBECONFIG"],
        docker_host=values["DOCKER_HOST"],
        registry=values["ELASTICDL_NODE_REGISTRY"],
        api=values["ELASTICDL_NODE_API"],
        bin_dir=bin_dir(),
        state_dir=state_dir,
        start_seconds=seconds,
        engines=engines,
    )


def start_cluster(state_dir: Path) -> subprocess.CompletedProcess:
    """``start-node.sh start`` (idempotent: joins a running cluster, restarts what is down)."""
    return subprocess.run(
        ["bash", str(script_path()), "start"],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        env={**os.environ, "ELASTICDL_NODE_DIR": str(state_dir)},
    )


class NodeLease:
    """Start (or join) the cluster; ``release()`` stops it when no other user remains."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self.node: Node | None = None

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[Node]:
        """The cluster for this process alone: waits until no other test process holds it,
        and hands it back (shared) afterwards. Whoever uses it meanwhile must leave it whole
        (every node up) when done; a stopped cluster is started again here."""
        assert self._fd is not None and self.node is not None, "acquire() first"
        waiter = node_dir() / f"{EXCLUSIVE_WAITER}{os.getpid()}"
        waiter.touch()  # before the shared lock goes
        try:
            # (a conversion: the shared lock is dropped, then the exclusive one awaited)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        finally:
            waiter.unlink()
        try:
            r = start_cluster(node_dir())  # whole: nothing of it may be down for these tests
            if r.returncode != 0:
                raise RuntimeError(f"start-node.sh start for exclusive use: {r.stderr[-500:]}")
            yield self.node
        finally:
            r = start_cluster(node_dir())
            fcntl.flock(self._fd, fcntl.LOCK_SH)
            if r.returncode != 0:
                raise RuntimeError(f"start-node.sh start after exclusive use: {r.stderr[-500:]}")

    def acquire(self) -> Node:
        reason = why_not_here()
        if reason:
            raise NodeUnavailable(reason)
        d = node_dir()
        d.mkdir(parents=True, exist_ok=True)
        # Shared lock first, so that a user finishing meanwhile does not stop our node.
        self._fd = os.open(d / "users.lock", os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_SH)
        env = {**os.environ, "ELASTICDL_NODE_DIR": str(d)}
        # Concurrent starters (parallel test files) take turns; start is idempotent.
        with open(d / "start.lock", "w") as start_lock:
            fcntl.flock(start_lock, fcntl.LOCK_EX)
            up = subprocess.run(
                ["bash", str(script_path()), "status"], capture_output=True, env=env
            )
            t0 = time.monotonic()
            r = start_cluster(d)
            seconds = time.monotonic() - t0
            if r.returncode != 0:
                self.release(stop=False)
                errors = [ln for ln in r.stderr.splitlines() if "error" in ln.lower()]
                tail = (errors or r.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise NodeUnavailable(f"start-node.sh failed (exit {r.returncode}): {tail}")
            if up.returncode != 0:
                # Not (fully) up before: the tests started it, so the tests stop it.
                (d / STARTED_MARKER).touch()
        self.node = parse_start_output(r.stdout, d, seconds)
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
                    return  # another test process still uses the cluster; it stops it
                if _exclusive_waiters():
                    return  # one waits for it alone (and will stop it when it leaves last)
                marker = node_dir() / STARTED_MARKER
                if not marker.exists():
                    return
                marker.unlink()
                pids = _node_pids()
                r = subprocess.run(
                    ["bash", str(script_path()), "stop"],
                    capture_output=True,
                    text=True,
                    timeout=180,
                    env={**os.environ, "ELASTICDL_NODE_DIR": str(node_dir())},
                )
                # Nothing of the node may be left: no process, no mount under its directory.
                left = [pid for pid in pids if process_running(pid)]
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
