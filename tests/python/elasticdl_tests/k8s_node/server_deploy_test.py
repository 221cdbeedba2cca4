"""The job server deployed IN the cluster from its own image, on the REAL node, used as a user
would (deploy/k8s/README.md, "The job server"):

1. ``build-images.sh server`` builds the server image on the shared CPU base image
   (server_image.py; cached between runs), which is pushed to the node's registry with the
   base (the build pods run the base);
2. ``deploy/k8s/server.yaml`` is applied with ``kubectl apply`` as shipped but for these
   substitutions, each because this cluster needs it:

   - namespace ``default`` -> the test's namespace (the manifest's header says to replace it
     throughout): objects, the RoleBinding's subject, ``--namespace``;
   - ``image:`` -> the image just pushed to the cluster's registry (what the admin names);
   - the commented build flags are filled in as the manifest says (``--build_base_image``,
     ``--build_repository`` in the cluster's registry, ``--state_volume``), without
     ``--registry_secret`` (the registry has no auth) and with ``--registry_insecure`` (it
     speaks plain HTTP) and ``--build_host_network``: the registry listens on this machine's
     loopback, where the nodes' engines pull from; a build pod on the pod network could not
     reach it there;
   - the PersistentVolumeClaim is bound to a hostPath PersistentVolume the test creates (this
     cluster has no storage provisioner), a directory owned by 10001 (hostPath keeps its owner).

   The server pod runs on the pod network as shipped (0.0.0.0:8443, the API server through the
   ``kubernetes`` Service). The TLS Secret comes from a certificate the test makes for the
   Service's DNS name and for localhost (``kubectl create secret tls``), the masters' RBAC from
   ``elasticdl rbac``, as the manifest's header says. A pod on the other node reaches the server
   through its ClusterIP Service's name; users on this machine through ``kubectl port-forward
   svc/elasticdl-server``, started again when the pod behind it is replaced.
3. As users: ``kubectl exec deploy/elasticdl-server -- elasticdl-server add-user`` prints
   alice's (and bob's) token; the SDK (``JobServerClient``, over TLS with the CA) uploads data
   and the ``mnist`` model zoo; alice's package job is built in the cluster and runs; the
   server pod is deleted mid-job and the Deployment's next pod still lists the job, which
   goes on and Succeeds (in the default pod network mode); its log comes through the server;
   bob gets "not found" for it; a job with a given image (the one just built) is cancelled
   and leaves no pod, service, NetworkPolicy or secret.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import statistics
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from elasticdl.client.main import main
from elasticdl.data.datasets import prepare
from elasticdl.jobs.errors import JobNotFoundError
from elasticdl.jobs.server_client import JobServerClient
from elasticdl.k8s import security
from elasticdl_tests.k8s_node import base_image as images
from elasticdl_tests.k8s_node.node import REQUIRE_ENV, repo_root
from elasticdl_tests.k8s_node.server_image import ensure_server_image, server_wheel
from elasticdl_tests.k8s_node.server_jobs import server_job_spec
from elasticdl_tests.waiting import wait_for

TRAIN_RECORDS = 256
RECORDS_PER_SHARD = 64
STATE = "/srv/elasticdl"


@pytest.fixture(scope="module")
def server_image(k8s_node, base_image) -> tuple[str, str, float]:
    """(the server image in the node's registry, the base there, build seconds; 0: reused)."""
    root = repo_root()
    dist = images.wheel_dir(root)
    if dist is None or server_wheel(dist) is None:
        message = (
            "the server image installs the server wheel: ./pants package //:elasticdl-server-wheel "
            "(and set ELASTICDL_WHEEL_DIR)"
        )
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{message} ({REQUIRE_ENV} is set)", pytrace=False)
        pytest.skip(message)
    base, _ = base_image
    pushed = f"{k8s_node.registry}/elasticdl-server:0.3.0"
    seconds = ensure_server_image(k8s_node, root, dist, base, pushed)
    base_pushed = f"{k8s_node.registry}/elasticdl:cpu"
    k8s_node.docker("tag", base, base_pushed)
    k8s_node.docker("push", base_pushed, timeout=600)
    k8s_node.docker("push", pushed, timeout=600)
    for image in (base_pushed, pushed):  # the other nodes' engines: now, not when a pod lands there
        k8s_node.pull_everywhere(image)
    return pushed, base_pushed, seconds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _certificate(directory: Path, ns: str) -> tuple[Path, Path]:
    cert, key = directory / "server.crt", directory / "server.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=elasticdl-server",
            "-addext",
            f"subjectAltName=DNS:elasticdl-server.{ns}.svc,DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def _manifest(ns: str, image: str, base: str, repository: str) -> list:
    """deploy/k8s/server.yaml with the substitutions the module docstring lists."""
    text = (repo_root() / "deploy" / "k8s" / "server.yaml").read_text()
    docs = [d for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        assert doc["metadata"]["namespace"] == "default"
        doc["metadata"]["namespace"] = ns
        for subject in doc.get("subjects") or []:
            subject["namespace"] = ns
        if doc["kind"] != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        container["image"] = image
        assert "--namespace=default" in container["command"], container["command"]
        container["command"] = [
            f"--namespace={ns}" if a == "--namespace=default" else a for a in container["command"]
        ] + [
            f"--build_base_image={base}",
            f"--build_repository={repository}",
            "--state_volume=claim_name=elasticdl-server-state",
            "--registry_insecure",
            "--build_host_network",
        ]
        assert "--host=0.0.0.0" in container["command"] and "--port=8443" in container["command"]
        assert not pod.get("hostNetwork") and "env" not in container
    return docs


class PortForward:
    """``kubectl port-forward svc/elasticdl-server <free port>:8443``: how a user on this
    machine reaches the in-cluster server. It forwards to one pod: ``restart`` after that pod
    is replaced."""

    def __init__(self, node, ns: str) -> None:
        self.node, self.ns = node, ns
        self.port = _free_port()
        self.url = f"https://localhost:{self.port}"
        self._proc: subprocess.Popen | None = None

    def restart(self) -> None:
        self.stop()
        self._proc = subprocess.Popen(
            [
                str(self.node.bin_dir / "kubectl"),
                f"--kubeconfig={self.node.kubeconfig}",
                "port-forward",
                "-n",
                self.ns,
                "--address=127.0.0.1",
                "svc/elasticdl-server",
                f"{self.port}:8443",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(10)
            self._proc = None


# Run in a pod on another node than the server's: the Service's name resolves (cluster DNS) to
# its ClusterIP, which kube-proxy sends to the server pod; 401 is the server's answer to a call
# without a token. Retried while the Service has no ready endpoint yet (kube-proxy refuses).
IN_CLUSTER_CALL = """
import os, ssl, time, urllib.error, urllib.request
context = ssl.create_default_context(cadata=os.environ["CA_PEM"])
for attempt in range(60):
    try:
        urllib.request.urlopen(os.environ["URL"] + "/v1/version", context=context, timeout=10)
    except urllib.error.HTTPError as e:
        print("HTTP", e.code)
        break
    except urllib.error.URLError as e:
        print("retrying:", e.reason, flush=True)
        time.sleep(1)
"""


def _call_from_a_pod(node, ns: str, image: str, avoid_node: str, ca: Path, scratch: Path) -> str:
    """What IN_CLUSTER_CALL printed in a pod on a node other than ``avoid_node``."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "in-cluster-user", "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "NotIn",
                                        "values": [avoid_node],
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-c", IN_CLUSTER_CALL],
                    "env": [
                        {"name": "CA_PEM", "value": ca.read_text()},
                        {"name": "URL", "value": f"https://elasticdl-server.{ns}.svc:8443"},
                    ],
                }
            ],
        },
    }
    path = scratch / "in-cluster-user.yaml"
    path.write_text(yaml.safe_dump(pod))
    node.kubectl("apply", "-f", str(path))

    def ended() -> str:
        phase = node.kubectl(
            "get", "pod", "-n", ns, "in-cluster-user", "-o", "jsonpath={.status.phase}", check=False
        )
        return phase if phase in ("Succeeded", "Failed") else ""

    wait_for(ended, 180, "the in-cluster user's pod to end")
    out = node.kubectl("logs", "-n", ns, "in-cluster-user", check=False)
    node.kubectl("delete", "pod", "-n", ns, "in-cluster-user", "--wait=false", check=False)
    return out.strip()


def _volume(ns: str, path: Path) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{ns}-server-state"},
        "spec": {
            "capacity": {"storage": "50Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": str(path), "type": "Directory"},
            "claimRef": {"namespace": ns, "name": "elasticdl-server-state"},
        },
    }


def _serving(url: str, ca: Path) -> bool:
    """The server answers HTTPS (401 without a token: every route needs one)."""
    context = ssl.create_default_context(cafile=str(ca))
    try:
        urllib.request.urlopen(f"{url}/v1/version", context=context, timeout=2)
    except urllib.error.HTTPError as e:
        return e.code == 401
    except OSError:
        return False
    return False


def _job_objects(node, ns: str, job: str) -> str:
    return node.kubectl(
        "get",
        "pods,services,networkpolicies,secrets",
        "-n",
        ns,
        "-l",
        f"elasticdl-job-name={job}",
        "-o",
        "name",
    ).strip()


def test_server_image_deployed_in_the_cluster_serves_users(
    k8s_node, server_image, node_namespace, node_k8s, tmp_path, capsys
):
    node, ns = k8s_node, node_namespace
    image, base, build_s = server_image
    capsys.readouterr()
    assert main(["rbac", f"--namespace={ns}"]) == 0  # the masters' ServiceAccount
    rbac = tmp_path / "rbac.yaml"
    rbac.write_text(capsys.readouterr().out)
    node.kubectl("apply", "-f", str(rbac))
    cert, key = _certificate(tmp_path, ns)
    node.kubectl(
        "create",
        "secret",
        "tls",
        "elasticdl-server-tls",
        "-n",
        ns,
        f"--cert={cert}",
        f"--key={key}",
    )
    state = tmp_path / "state"
    state.mkdir()
    os.chown(state, security.RUN_AS_USER, security.RUN_AS_GROUP)
    volume = _volume(ns, state)
    repository = f"{node.registry}/elasticdl-jobs-{ns}"
    manifest = tmp_path / "server.yaml"
    manifest.write_text(yaml.safe_dump_all([volume] + _manifest(ns, image, base, repository)))
    forward = PortForward(node, ns)
    url = forward.url

    def diagnose() -> str:
        out = node.kubectl("get", "pods,pvc,deploy", "-n", ns, "-o", "wide", check=False)
        for pod in node.kubectl("get", "pods", "-n", ns, "-o", "name", check=False).split():
            out += f"\n--- {pod} ---\n"
            out += node.kubectl("logs", "-n", ns, pod, "--all-containers", "--tail=30", check=False)
        return out + node.kubectl("get", "events", "-n", ns, check=False)[-3000:]

    def server_pods() -> list:
        return [
            p
            for p in node_k8s.list_pods("app=elasticdl-server")
            if p.metadata.deletion_timestamp is None
        ]

    try:
        t0 = time.monotonic()
        node.kubectl("apply", "-f", str(manifest))

        def server_ready() -> bool:
            pods = server_pods()
            conditions = (pods[0].status.conditions or []) if len(pods) == 1 else []
            return any(c.type == "Ready" and c.status == "True" for c in conditions)

        wait_for(server_ready, 180, "the server pod to be Ready", diagnose)
        forward.restart()
        wait_for(lambda: _serving(url, cert), 120, "the server to serve HTTPS", diagnose)
        start_s = time.monotonic() - t0
        (pod,) = server_pods()
        assert pod.spec.containers[0].image == image
        assert pod.spec.service_account_name == "elasticdl-server"
        assert pod.spec.security_context.run_as_user == 10001
        assert not pod.spec.host_network and pod.status.pod_ip.startswith(node.range_prefix)
        # From a pod on the other node, through the Service's name and ClusterIP.
        answer = _call_from_a_pod(node, ns, base, pod.spec.node_name, cert, tmp_path)
        assert answer.splitlines()[-1] == "HTTP 401", answer

        def add_user(name: str) -> str:
            return node.kubectl(
                "exec",
                "-n",
                ns,
                "deploy/elasticdl-server",
                "--",
                "elasticdl-server",
                "add-user",
                name,
                f"--state_dir={STATE}",
            ).strip()

        alice = JobServerClient(url, add_user("alice"), ca=str(cert))
        bob = JobServerClient(url, add_user("bob"), ca=str(cert))
        assert alice.version()["platform"] == "kubernetes"
        assert alice.version()["user"] == "alice"

        data = tmp_path / "fashion"
        prepare(
            "fashion_mnist",
            str(data),
            progress=False,
            limit=TRAIN_RECORDS,
            records_per_shard=RECORDS_PER_SHARD,
        )
        alice.upload(str(data / "train"), "fashion/train")
        # What the pods read is on the volume, written by the server as 10001.
        shard = next((state / "data" / "alice" / "fashion" / "train").iterdir())
        assert shard.stat().st_uid == security.RUN_AS_USER

        zoo = tmp_path / "zoo"
        shutil.copytree(
            repo_root() / "model_zoo" / "mnist",
            zoo / "mnist",
            ignore=shutil.ignore_patterns("__pycache__", "BUILD", "*_test.py"),
        )
        (zoo / "requirements.txt").write_text("numpy\n")  # in the base: nothing to install
        package = alice.upload_package(zoo)

        # --- a package job: built in the cluster, then run ------------------------------
        job = f"deployed-{uuid.uuid4().hex[:4]}"
        t_job = time.monotonic()
        status = alice.submit_job(server_job_spec(job), package_id=package)
        assert status.phase == "Pending" and "building image" in status.message, status
        master = f"elasticdl-{job}-master"

        def running() -> bool:
            pod = node_k8s.get_pod(master)
            return pod is not None and pod.status.phase == "Running"

        wait_for(running, 400, "the job's master pod to run", diagnose)
        # bob sees nothing of it and cannot touch it.
        assert bob.list_jobs() == []
        for call in (bob.get_job_status, bob.stop_job):
            with pytest.raises(JobNotFoundError):
                call(job)

        # --- the server pod dies mid-job; the Deployment's next one carries on ----------
        assert alice.get_job_status(job).phase == "Running"
        (old,) = server_pods()
        t_kill = time.monotonic()
        node.kubectl("delete", "pod", "-n", ns, old.metadata.name, "--wait=false")
        wait_for(
            lambda: [p for p in server_pods() if p.metadata.name != old.metadata.name],
            60,
            "the Deployment's next server pod",
            diagnose,
        )
        # Until the kubelet has stopped it, the old server may still answer (and hold the
        # state directory's lock: the next one exits and is restarted until it gets it).
        wait_for(
            lambda: node_k8s.get_pod(old.metadata.name) is None,
            120,
            "the deleted server pod to go",
            diagnose,
        )

        def listed() -> list:
            try:
                return [s.job_name for s in alice.list_jobs()]
            except Exception:
                forward.restart()  # it forwarded to the pod that went
                return []

        assert wait_for(listed, 180, "the next server to list the job", diagnose) == [job]
        successor_s = time.monotonic() - t_kill
        (new,) = server_pods()
        assert new.metadata.name != old.metadata.name
        restarts = new.status.container_statuses[0].restart_count

        final = alice.wait(job, timeout=600)
        job_s = time.monotonic() - t_job
        assert final.phase == "Succeeded", f"{final.message}\n{diagnose()}"
        log = "".join(alice.tail_logs(job))
        assert f"trained {TRAIN_RECORDS}/{TRAIN_RECORDS} records" in log, log[-3000:]
        built = node_k8s.get_pod(master).spec.containers[0].image
        assert built.startswith(f"{repository}:pkg-"), built
        (listed_job,) = alice.list_jobs()
        assert listed_job.job_name == job and listed_job.phase == "Succeeded"

        # list / status latency through the in-cluster server (medians of 20)
        def median_ms(call) -> float:
            times = []
            for _ in range(20):
                t = time.perf_counter()
                call()
                times.append((time.perf_counter() - t) * 1000)
            return statistics.median(times)

        version_ms = median_ms(alice.version)  # the baseline: TLS + token, no cluster reads
        list_ms = median_ms(alice.list_jobs)
        status_ms = median_ms(lambda: alice.get_job_status(job))

        # --- a job with a given image, cancelled: nothing of it is left -----------------
        gone = f"given-{uuid.uuid4().hex[:4]}"
        alice.submit_job(server_job_spec(gone), image=built)
        wait_for(
            lambda: node_k8s.get_pod(f"elasticdl-{gone}-worker-0"),
            180,
            "the cancelled job's worker pod",
            diagnose,
        )
        assert alice.stop_job(gone).phase == "Cancelled"
        wait_for(
            lambda: _job_objects(node, ns, gone) == "",
            120,
            "the cancelled job's objects to go",
            lambda: _job_objects(node, ns, gone) + "\n" + diagnose(),
        )
        assert gone not in [s.job_name for s in alice.list_jobs()]
        print(
            f"\nin-cluster server: image build {build_s:.1f} s (0: cached), apply -> serving "
            f"{start_s:.1f} s, pod deleted -> successor lists the job {successor_s:.1f} s "
            f"({restarts} restarts), package job submit -> Succeeded {job_s:.1f} s; medians of "
            f"20: version {version_ms:.1f} ms, list {list_ms:.1f} ms, status {status_ms:.1f} ms "
            f"(1 job); load {os.getloadavg()[0]:.1f}"
        )
    finally:
        forward.stop()
        node.kubectl("delete", "-f", str(manifest), "--wait=false", check=False)
        node.kubectl("delete", "pv", volume["metadata"]["name"], "--wait=false", check=False)
        # The built images the kubelet pulled (their base layers stay: the base image's).
        for where, listed in node.docker_each(
            "images", "--format", "{{.Repository}}:{{.Tag}}", check=False
        ).items():
            for pulled in listed.split():
                if pulled.startswith(f"{repository}:"):
                    node.docker_on(where, "rmi", pulled, check=False)
