"""A real, single-machine Kubernetes control plane for tests: etcd + kube-apiserver +
kube-controller-manager on loopback ports.

The binaries come from ``scripts/k8s/build-apiserver.sh`` (Kubernetes v1.20.2 built from
Debian's source package; etcd from Debian), found in ``$ELASTICDL_K8S_BIN`` or
``${ELASTICDL_K8S_CACHE:-~/.cache/elasticdl/k8s-1.20.2}/bin``.

What is real: the API server with its validation, admission (incl. Priority), RBAC,
token authentication, watch semantics and graceful deletion; the garbage collector
(owner references / cascading deletion), the namespace, service-account and Job controllers
of kube-controller-manager. What is not there: a scheduler and a kubelet —
``elasticdl_tests.k8s.process_kubelet`` stands in for both.

Authentication uses static bearer tokens (``tokens.csv``): :attr:`LocalCluster.admin_token`
(group ``system:masters``) and :attr:`LocalCluster.user_token` (user ``elasticdl-tester``,
no groups, so it can do nothing until a RoleBinding grants it something). Service-account
tokens work too (signed with a key generated here). TLS is verified: a throw-away CA made
with ``openssl`` signs the API server's certificate, and the kubeconfig carries that CA.

Command line (used by ``scripts/k8s/start-cluster.sh`` / ``stop-cluster.sh``)::

    python -m elasticdl_tests.k8s.cluster start --state-dir DIR   # prints the kubeconfig path
    python -m elasticdl_tests.k8s.cluster stop --state-dir DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

logger = logging.getLogger(__name__)

K8S_VERSION = "1.20.2"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")
ADMIN_TOKEN = "elasticdl-admin-token"
USER_TOKEN = "elasticdl-tester-token"
USER_NAME = "elasticdl-tester"
SERVICE_CIDR = "10.0.0.0/24"


class ClusterError(RuntimeError):
    pass


class ProcessExited(ClusterError):
    """A control-plane process exited; ``name`` says which."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name = name


# How often start() starts the API server before giving up. It exits on purpose (a klog
# fatal, status 255) when etcd answers too slowly during its start-up checks, as on a loaded
# 2-core machine; its real supervisors (the kubelet for a static pod, systemd) restart it.
APISERVER_START_ATTEMPTS = 3


def fatal_lines(log_text: str) -> list[str]:
    """The klog fatal lines (``F1129 01:02:03.000000 123 file.go:1] why``) of a log: the reason
    a Kubernetes binary exited, which its goroutine dump that follows pushes out of any tail."""
    return [line for line in log_text.splitlines() if re.match(r"F\d{4} ", line)]


def default_bin_dir() -> Path:
    if os.environ.get("ELASTICDL_K8S_BIN"):
        return Path(os.environ["ELASTICDL_K8S_BIN"])
    cache = os.environ.get("ELASTICDL_K8S_CACHE") or os.path.expanduser(
        f"~/.cache/elasticdl/k8s-{K8S_VERSION}"
    )
    return Path(cache) / "bin"


def missing_binaries(bin_dir: Path | None = None) -> list[str]:
    bin_dir = bin_dir or default_bin_dir()
    return [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]


def _load_prctl():
    # Looked up once in the parent: after fork() the child must not dlopen (another thread
    # may have held the loader lock at fork time).
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn``: the child gets SIGKILL when the thread that started it dies (Linux
    PR_SET_PDEATHSIG), so a test runner killed by a timeout leaves no API server behind."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _distinct_free_ports(count: int, avoid: set[int] = frozenset()) -> list[int]:
    """``count`` free loopback ports, none twice and none in ``avoid`` (the kernel may hand a
    just-closed port out again)."""
    ports: list[int] = []
    while len(ports) < count:
        port = _free_port()
        if port not in ports and port not in avoid:
            ports.append(port)
    return ports


def _run(cmd: list[str], cwd: Path) -> None:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ClusterError(f"{' '.join(cmd[:3])} failed: {result.stderr.strip()[-500:]}")


def make_certificates(cert_dir: Path) -> None:
    """CA, API-server serving certificate (127.0.0.1/localhost) and service-account key pair."""
    if not shutil.which("openssl"):
        raise ClusterError("openssl is needed to create the test cluster's certificates")
    cert_dir.mkdir(parents=True, exist_ok=True)
    (cert_dir / "server.ext").write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc\n"
    )
    steps = [
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "3650",
            "-subj",
            "/CN=elasticdl-test-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
        [
            "openssl",
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=kube-apiserver",
        ],
        [
            "openssl",
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "3650",
            "-extfile",
            "server.ext",
        ],
        ["openssl", "genrsa", "-out", "sa.key", "2048"],
        ["openssl", "rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"],
    ]
    for step in steps:
        _run(step, cert_dir)


def write_kubeconfig(
    path: Path, server: str, ca_file: Path, token: str, namespace: str = "default"
) -> None:
    import base64

    ca_data = base64.b64encode(ca_file.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "elasticdl-test",
                "cluster": {"server": server, "certificate-authority-data": ca_data},
            }
        ],
        "users": [{"name": "elasticdl-test-user", "user": {"token": token}}],
        "contexts": [
            {
                "name": "elasticdl-test",
                "context": {
                    "cluster": "elasticdl-test",
                    "user": "elasticdl-test-user",
                    "namespace": namespace,
                },
            }
        ],
        "current-context": "elasticdl-test",
    }
    path.write_text(json.dumps(config, indent=2))  # JSON is valid YAML
    path.chmod(0o600)


@dataclasses.dataclass
class LocalCluster:
    """etcd + kube-apiserver + kube-controller-manager under ``state_dir``."""

    state_dir: Path
    bin_dir: Path = dataclasses.field(default_factory=default_bin_dir)
    etcd_port: int = 0
    etcd_peer_port: int = 0
    apiserver_port: int = 0
    pids: dict = dataclasses.field(default_factory=dict)
    admin_token: str = ADMIN_TOKEN
    user_token: str = USER_TOKEN
    # True for test fixtures (processes die with the test runner); False for the CLI, whose
    # processes must outlive it until stop-cluster.sh.
    tied_to_parent: bool = True
    _procs: dict = dataclasses.field(default_factory=dict, repr=False)

    # -- paths --
    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def cert_dir(self) -> Path:
        return self.state_dir / "certs"

    @property
    def ca_file(self) -> Path:
        return self.cert_dir / "ca.crt"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def user_kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig-user"

    def log_path(self, name: str) -> Path:
        return self.state_dir / "logs" / f"{name}.log"

    # -- lifecycle --
    def start(self, timeout: float | None = None) -> "LocalCluster":
        """Start everything; ``timeout`` (default ``$ELASTICDL_K8S_START_TIMEOUT`` or 180 s:
        loaded CI machines are slow) bounds the wait for the API server."""
        if timeout is None:
            timeout = float(os.environ.get("ELASTICDL_K8S_START_TIMEOUT", "180"))
        missing = missing_binaries(self.bin_dir)
        if missing:
            raise ClusterError(
                f"missing {', '.join(missing)} in {self.bin_dir}; "
                "build them with scripts/k8s/build-apiserver.sh"
            )
        self.state_dir = Path(self.state_dir).resolve()
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        make_certificates(self.cert_dir)
        (self.state_dir / "tokens.csv").write_text(
            f'{self.admin_token},admin,admin-uid,"system:masters"\n'
            f"{self.user_token},{USER_NAME},{USER_NAME}-uid\n"
        )
        self.etcd_port, self.etcd_peer_port = _distinct_free_ports(2)
        try:
            self._start_etcd()
            self._wait_etcd_healthy(timeout)
            self._start_apiserver_until_ready(timeout)
            write_kubeconfig(self.kubeconfig, self.server, self.ca_file, self.admin_token)
            write_kubeconfig(self.user_kubeconfig, self.server, self.ca_file, self.user_token)
            self._start_controller_manager()
        except BaseException:
            self.stop()
            raise
        self._save_state()
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.log_path(name), "ab")
        # Own session: the processes survive the CLI that started them and a Ctrl-C in the
        # test runner's terminal does not hit them before stop() does.
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent if self.tied_to_parent else None,
        )
        log.close()
        self._procs[name] = proc
        self.pids[name] = proc.pid

    def _start_etcd(self) -> None:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client_url = f"http://127.0.0.1:{self.etcd_port}"
        self._spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--log-level=warn",
            ],
        )

    def _wait_etcd_healthy(self, timeout: float) -> None:
        """The API server's start-up checks give etcd little time: start it once etcd answers."""
        url = f"http://127.0.0.1:{self.etcd_port}/health"
        self._poll_until_ok(urllib.request.Request(url), None, timeout, "etcd not healthy")

    def _start_apiserver_until_ready(self, timeout: float) -> None:
        """Start the API server and wait for ``/readyz``; when it exits before it is ready,
        start it again on a fresh port (its port may have been taken between choosing and
        binding), up to :data:`APISERVER_START_ATTEMPTS` times within ``timeout``."""
        deadline = time.monotonic() + timeout
        for attempt in range(1, APISERVER_START_ATTEMPTS + 1):
            (self.apiserver_port,) = _distinct_free_ports(
                1, avoid={self.etcd_port, self.etcd_peer_port}
            )
            self._start_apiserver()
            try:
                self._wait_ready(max(deadline - time.monotonic(), 1.0))
                return
            except ProcessExited as exited:
                if exited.name != "kube-apiserver" or attempt == APISERVER_START_ATTEMPTS:
                    raise
                logger.warning(
                    "kube-apiserver exited before it was ready (attempt %d of %d), starting it "
                    "again: %s",
                    attempt,
                    APISERVER_START_ATTEMPTS,
                    str(exited).splitlines()[0],
                )
                self._procs.pop("kube-apiserver", None)
                self.pids.pop("kube-apiserver", None)

    def _start_apiserver(self) -> None:
        c = self.cert_dir
        self._spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                "--insecure-port=0",
                f"--tls-cert-file={c / 'server.crt'}",
                f"--tls-private-key-file={c / 'server.key'}",
                f"--cert-dir={c}",
                f"--token-auth-file={self.state_dir / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                f"--service-account-key-file={c / 'sa.pub'}",
                f"--service-account-signing-key-file={c / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # No kubelet mounts tokens here, and pods must not wait for the token controller.
                "--disable-admission-plugins=ServiceAccount",
                "--profiling=false",
                "--v=1",
            ],
        )

    def _start_controller_manager(self) -> None:
        c = self.cert_dir
        self._spawn(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--controllers=garbagecollector,namespace,serviceaccount,serviceaccount-token,job",
                f"--service-account-private-key-file={c / 'sa.key'}",
                f"--root-ca-file={self.ca_file}",
                "--port=0",
                "--secure-port=0",
                "--concurrent-gc-syncs=5",
                "--v=1",
            ],
        )

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                text = self.log_path(name).read_text(errors="replace")
                fatal = fatal_lines(text)
                detail = "\n".join(fatal[:3]) if fatal else text[-1500:]
                raise ProcessExited(
                    name,
                    f"{name} exited with {proc.returncode} (log {self.log_path(name)}):\n{detail}",
                )

    def _wait_ready(self, timeout: float) -> None:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        request = urllib.request.Request(
            f"{self.server}/readyz", headers={"Authorization": f"Bearer {self.admin_token}"}
        )
        self._poll_until_ok(request, ctx, timeout, "kube-apiserver not ready")

    def _poll_until_ok(self, request, context, timeout: float, what: str) -> None:
        """Until `request` answers 200, every 0.3 s; a process of the cluster that exits ends
        the wait (`ProcessExited`), `timeout` a ClusterError starting with `what`."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(request, context=context, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.3)
        raise ClusterError(f"{what} after {timeout:.0f}s ({last})")

    def _save_state(self) -> None:
        state = {
            "pids": self.pids,
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "user_kubeconfig": str(self.user_kubeconfig),
            "admin_token": self.admin_token,
            "user_token": self.user_token,
            "ca_file": str(self.ca_file),
        }
        (self.state_dir / "state.json").write_text(json.dumps(state, indent=2))

    def stop(self, timeout: float = 10.0) -> None:
        """Stop controller-manager and apiserver before etcd (SIGTERM, SIGKILL after timeout)."""
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            pid = self.pids.pop(name, None)
            proc = self._procs.pop(name, None)
            if pid is None:
                continue
            _terminate(pid, proc, timeout)

    # -- clients --
    def api_client(self, token: str | None = None):
        """A ``kubernetes.client.ApiClient`` for this cluster (admin token by default)."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.server
        configuration.ssl_ca_cert = str(self.ca_file)
        configuration.verify_ssl = True
        configuration.api_key = {"authorization": token or self.admin_token}
        configuration.api_key_prefix = {"authorization": "Bearer"}
        return client.ApiClient(configuration)


def _terminate(pid: int, proc: subprocess.Popen | None, timeout: float) -> None:
    def alive() -> bool:
        if proc is not None:
            return proc.poll() is None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        # A zombie child of someone else counts as gone.
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(")")[-1].split()[0] != "Z"
        except OSError:
            return False

    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        if proc is not None:
            proc.wait(5)


def stop_from_state(state_dir: Path) -> None:
    state_file = Path(state_dir) / "state.json"
    if not state_file.exists():
        raise ClusterError(
            f"no cluster state in {state_dir} (was it started with --state-dir {state_dir}?)"
        )
    state = json.loads(state_file.read_text())
    for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
        pid = state["pids"].get(name)
        if pid:
            _terminate(int(pid), None, 10.0)
    state_file.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="elasticdl_tests.k8s.cluster", description=__doc__.split("\n")[0]
    )
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument(
        "--state-dir", default="", help="Directory for certificates, etcd data, logs and pids"
    )
    parser.add_argument(
        "--bin-dir",
        default="",
        help="Directory holding etcd, kube-apiserver, kube-controller-manager",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.action == "start":
            state_dir = Path(args.state_dir or tempfile.mkdtemp(prefix="elasticdl-k8s-"))
            cluster = LocalCluster(
                state_dir=state_dir,
                bin_dir=Path(args.bin_dir) if args.bin_dir else default_bin_dir(),
                tied_to_parent=False,
            )
            cluster.start()
            print(cluster.kubeconfig)
        else:
            if not args.state_dir:
                parser.error("stop needs --state-dir")
            stop_from_state(Path(args.state_dir))
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
