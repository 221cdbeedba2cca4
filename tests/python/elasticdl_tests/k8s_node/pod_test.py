"""Pods in REAL containers on the real cluster's nodes, through the project's own Kubernetes code: pods
built by ``elasticdl.k8s.pods.build_pod`` (volumes from ``--volume`` strings, resources),
created, read and deleted by ``elasticdl.k8s.client.K8sClient``, their end read by
``elasticdl.k8s.termination.read_termination`` (what the master decides relaunches on), their
logs served by the kubelet and read by ``elasticdl logs`` (``KubernetesBackend.logs``).

The image is ``local/busybox:node`` (a static busybox every node's engine has, imported by
start-node.sh). The pods use the host network, as ElasticDL's host mode does: a pod's IP is its
node's (127.0.0.i). A container is handled through the engine of the node it runs on.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest
from elasticdl.jobs.k8s_backend import KubernetesBackend
from elasticdl.k8s import security
from elasticdl.k8s.names import master_pod_name
from elasticdl.k8s.pods import PodTemplate, build_pod
from elasticdl.k8s.termination import read_termination

BUSYBOX = "local/busybox:node"


def _pod(
    k8s,
    name: str,
    command: list[str],
    *,
    volume: str = "",
    limit: str = "",
    replica_type: str = "worker",
    job: str = "pods",
    grace: int | None = 5,
):
    template = PodTemplate(
        namespace=k8s.namespace,
        image_pull_policy="Never",
        volume=volume,
        envs={"ELASTICDL_K8S_NETWORK": "host"},
    )
    pod = build_pod(
        template,
        name=name,
        job_name=job,
        replica_type=replica_type,
        replica_id=0,
        image=BUSYBOX,
        command=command,
        resource_request=limit,
        resource_limit=limit,
    )
    pod.spec.termination_grace_period_seconds = grace
    return pod


def _wait(k8s, name: str, predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        pod = k8s.get_pod(name)
        if pod is not None and predicate(pod):
            return pod
        if time.monotonic() > deadline:
            phase = pod.status.phase if pod is not None else "gone"
            raise AssertionError(f"pod {name}: condition not reached in {timeout}s (phase {phase})")
        time.sleep(0.1)


def _running(pod) -> bool:
    return pod.status.phase == "Running"


def _ended(pod) -> bool:
    return read_termination(pod).is_terminal


def _container_id(pod) -> str:
    return pod.status.container_statuses[0].container_id.split("://", 1)[1]


def test_pod_runs_with_a_host_path_volume_and_its_exit_code_and_logs_are_read(
    k8s_node, node_k8s, tmp_path, capsys
):
    data = tmp_path / "data"
    data.mkdir()
    token = uuid.uuid4().hex
    (data / "in.txt").write_text(f"from-host {token}\n")
    # The pod runs as the restricted pods' non-root user: a hostPath keeps its owner and mode.
    os.chown(data, security.RUN_AS_USER, security.RUN_AS_GROUP)
    command = [
        "sh",
        "-c",
        "echo hello; cat /data/in.txt; echo from-pod >/data/out.txt; " "sleep 2; exit 3",
    ]
    t0 = time.monotonic()
    node_k8s.create_pod(
        _pod(node_k8s, "hello", command, volume=f"host_path={data},mount_path=/data")
    )
    running = _wait(node_k8s, "hello", _running)
    running_s = time.monotonic() - t0
    # A real container of its node's engine, on the host network (the pod's IP is its node's).
    node = running.spec.node_name
    assert node in k8s_node.nodes
    assert running.status.pod_ip == node and running.spec.host_network is True
    cid = _container_id(running)
    assert k8s_node.docker_on(node, "inspect", "-f", "{{.State.Running}}", cid).strip() == "true"

    ended = _wait(node_k8s, "hello", _ended)
    reading = read_termination(ended)
    assert (reading.phase, reading.exit_code, reading.reason) == ("Failed", 3, "Error")
    assert (data / "out.txt").read_text() == "from-pod\n"
    assert (data / "out.txt").stat().st_uid == security.RUN_AS_USER  # written as non-root
    # The log comes from the container, served by the kubelet through the API server.
    log = node_k8s.read_pod_log("hello")
    assert log.splitlines()[:2] == ["hello", f"from-host {token}"], log
    with capsys.disabled():
        print(
            f"\nreal node: started in {k8s_node.start_seconds:.1f}s (this process), "
            f"pod create -> Running {running_s:.2f}s"
        )


def test_elasticdl_logs_and_status_read_a_master_pod_through_the_kubelet(k8s_node, node_k8s):
    job = f"logs-{uuid.uuid4().hex[:6]}"
    master = master_pod_name(job)
    node_k8s.create_pod(
        _pod(
            node_k8s,
            master,
            ["sh", "-c", "for i in 1 2 3; do echo line $i; sleep 0.5; done; echo done"],
            replica_type="master",
            job=job,
        )
    )
    backend = KubernetesBackend(node_k8s.namespace, k8s=node_k8s)
    _wait(node_k8s, master, lambda p: p.status.phase in ("Running", "Succeeded"))
    # -f: follows the container's output until it ends.
    followed = "".join(backend.logs(job, follow=True))
    assert followed.splitlines() == ["line 1", "line 2", "line 3", "done"], followed
    _wait(node_k8s, master, _ended)
    assert "".join(backend.logs(job)).splitlines()[-1] == "done"
    status = backend.status(job)
    assert status.phase == "Succeeded", status


# Docker marks a container OOMKilled from the cgroup's OOM event, which can arrive after it has
# handled the container's exit (on a loaded machine): that one reads as a plain SIGKILL. The
# kubelet reports what Docker says, so the reading is checked on up to three kills.
OOM_TRIES = 3


def test_memory_limited_pod_is_oom_killed(node_k8s):
    readings = []
    for attempt in range(OOM_TRIES):
        # The allocating process is PID 1 (a shell would survive its child's OOM kill).
        name = f"oom-{attempt}"
        node_k8s.create_pod(
            _pod(
                node_k8s,
                name,
                ["dd", "if=/dev/zero", "of=/dev/null", "bs=200M", "count=1"],
                limit="cpu=0.5,memory=50Mi",
            )
        )
        reading = read_termination(_wait(node_k8s, name, _ended))
        readings.append((reading.phase, reading.exit_code, reading.reason))
        assert readings[-1][:2] == ("Failed", 137), readings
        if reading.reason == "OOMKilled":
            break
    assert readings[-1] == ("Failed", 137, "OOMKilled"), readings


def test_docker_kill_reads_as_exit_137_without_oom(k8s_node, node_k8s):
    node_k8s.create_pod(_pod(node_k8s, "victim", ["sleep", "3600"]))
    victim = _wait(node_k8s, "victim", _running)
    k8s_node.docker_on(victim.spec.node_name, "kill", _container_id(victim))
    reading = read_termination(_wait(node_k8s, "victim", _ended, timeout=30))
    # The preemption signature the master relaunches on: SIGKILL, not OOMKilled.
    assert (reading.phase, reading.exit_code, reading.reason) == ("Failed", 137, "Error")


def test_delete_stops_the_container(k8s_node, node_k8s):
    command = ["sh", "-c", "trap 'exit 143' TERM; sleep 3600 & wait"]
    node_k8s.create_pod(_pod(node_k8s, "doomed", command, grace=10))
    doomed = _wait(node_k8s, "doomed", _running)
    cid, node = _container_id(doomed), doomed.spec.node_name
    t0 = time.monotonic()
    assert node_k8s.delete_pod("doomed")
    while (
        k8s_node.docker_on(node, "inspect", "-f", "{{.State.Running}}", cid, check=False).strip()
        == "true"
    ):
        assert time.monotonic() - t0 < 15, "container still running 15s after the delete"
        time.sleep(0.1)
    stopped_s = time.monotonic() - t0
    assert stopped_s < 10  # SIGTERM at once (grace 10 s would mean it was ignored)
    # The pod object goes on a later sync of the kubelet, once its volumes (the restricted
    # pods' /tmp emptyDir) and cgroup are cleaned up: which can take over 30 s on a loaded machine.
    assert node_k8s.wait_pod_gone("doomed", timeout=60)


def test_nodes_are_on_loopback_and_their_kubelets_refuse_anonymous_requests(k8s_node):
    """The nodes' addresses and servers: node i is 127.0.0.i (name and only address), its
    kubelet listens there on its own port and refuses anonymous requests (x509 + webhook
    authorization)."""
    import ssl
    import urllib.error
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(k8s_node.state_dir / "pki" / "ca.crt"))
    for i, node in enumerate(k8s_node.nodes, 1):
        assert node == f"127.0.0.{i}"
        addresses = k8s_node.kubectl(
            "get", "node", node, "-o", "jsonpath={.status.addresses[*].address}"
        ).split()
        assert set(addresses) == {node}
        # start-node.sh: node i's kubelet = port base + 10 + (i - 1)
        port = int(k8s_node.api.rsplit(":", 1)[1]) + 9 + i
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"https://{node}:{port}/pods", context=ctx, timeout=10)
        assert e.value.code == 401
