"""The real cluster losing a node, and stopping: tests that take nodes (or the whole cluster)
from under its pods, so they run with the cluster to this module alone (``exclusive_cluster``:
they wait until no other test process uses it; it is handed back whole afterwards).

1. A node loss: ``start-node.sh stop-node 2`` kills node 2's kubelet, its engine and every
   container on it at once (its cgroup frozen, then SIGKILL), as when a machine dies. The node
   goes NotReady and gets the ``unreachable`` NoExecute taint (the controller-manager carries
   the fix for v1.20.2's taint-queue bug, scripts/k8s/patches/), the pods tolerating it for 5 s
   are evicted, the Deployment's replacement runs on node 1 and the cluster DNS record of its
   headless Service follows it. ``start-node 2`` boots the node again: it rejoins Ready, the
   evicted pods are gone for good and a new pod runs there.
2. ``start-node.sh stop`` leaves nothing behind: no process, mount, bridge, veth, route,
   iptables rule or chain (ours, kube-proxy's, the portmap plugin's), pod network namespace or
   cgroup; then the cluster is started again for the other tests.
   The registry's images and the engines' copies of them outlive a stop (a restart pushes and
   pulls nothing again); a start that finds the kept registry above its bound
   (``ELASTICDL_NODE_REGISTRY_KEEP_MB``) empties it and drops the engines' copies.
3. A cluster killed hard (every process SIGKILLed, its run dir with the records of what it
   added removed, as after a crash): ``start`` removes what it left (found by the tag of its
   iptables rules and the names of its links) and starts a working cluster; killed hard again,
   ``stop`` alone leaves nothing behind either. Throughout, the machine's ``docker0`` (another
   engine's bridge) survives the nodes' engines.
4. A node's engine that exits while starting is started again (twice at most, as systemd's
   docker.service restarts it), its log kept; one that keeps exiting fails the start at once,
   the error ending with that engine's last log line, instead of after the engines' timeout.
   The failures come from a wrapper ahead of the real ``dockerd`` on PATH (a fault injected:
   an engine's own start-up failures cannot be produced on demand).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from elasticdl_tests.k8s_node import cluster_objects as objects
from elasticdl_tests.k8s_node.node import process_running
from elasticdl_tests.waiting import wait_for

# Kubernetes' default is 300 s; the lost node's pods go 5 s after its NoExecute taint.
TOLERATIONS = """
      tolerations:
      - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 5}
      - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 5}"""
NODE_LOSS_TIMEOUT_S = 180  # grace 40 s + monitor 5 s + taint + 5 s toleration, on a busy machine


def _node(cluster, name: str) -> dict:
    return json.loads(cluster.kubectl("get", "node", name, "-o", "json"))


def _ready(cluster, name: str) -> str:
    conditions = _node(cluster, name)["status"].get("conditions") or []
    return next((c["status"] for c in conditions if c["type"] == "Ready"), "")


def _dns(cluster, name: str) -> str:
    """What the cluster DNS server answers for `name` (asked from the machine)."""
    dns_ip = cluster.range_prefix + ".0.10"  # start-node.sh: the DNS server is <A.B>.0.10
    r = subprocess.run(
        [str(cluster.bin_dir / "busybox"), "nslookup", name, dns_ip],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return r.stdout


def test_a_lost_node_is_evicted_and_replaced_and_rejoins(
    exclusive_cluster, node_namespace, tmp_path
):
    cluster, ns = exclusive_cluster, node_namespace
    assert len(cluster.nodes) >= 2, cluster.nodes
    survivor, lost = cluster.nodes[0], cluster.nodes[1]
    objects.apply(
        cluster,
        ns,
        f"""
apiVersion: v1
kind: Service
metadata: {{name: mover}}
spec: {{clusterIP: None, selector: {{app: mover}}, ports: [{{port: 1}}]}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: mover}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: mover}}}}
  template:
    metadata: {{labels: {{app: mover}}}}
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 1{TOLERATIONS}
      affinity:
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            preference: {{matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: ["{lost}"]}}]}}
      containers:
      - {{name: c, image: {objects.BUSYBOX}, imagePullPolicy: Never, command: {json.dumps(objects.SLEEPER)}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: lone}}
spec:
  nodeName: "{lost}"
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  {TOLERATIONS.strip()}
  containers: [{{name: c, image: {objects.BUSYBOX}, imagePullPolicy: Never, command: {json.dumps(objects.SLEEPER)}}}]
""",
        tmp_path,
    )

    def diagnose() -> str:
        return objects.describe(cluster, ns) + cluster.kubectl("get", "nodes", check=False)

    def mover_running_on(node: str):
        for p in objects.pods(cluster, ns, "app=mover"):
            if (
                p["spec"].get("nodeName") == node
                and p["status"].get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")
            ):
                return p
        return None

    first = wait_for(
        lambda: mover_running_on(lost), 120, f"the Deployment's pod on {lost}", diagnose
    )
    objects.running(cluster, ns, "lone")
    record = f"mover.{ns}.svc.cluster.local"
    wait_for(lambda: first["status"]["podIP"] in _dns(cluster, record), 60, "its DNS record")

    t0 = time.monotonic()
    r = cluster.script("stop-node", "2")
    assert r.returncode == 0, r.stderr
    with pytest.raises(AssertionError):  # its engine is gone with it
        cluster.docker_on(lost, "ps", timeout=30)
    times = {}

    def note(what: str) -> bool:
        times.setdefault(what, time.monotonic() - t0)
        return True

    wait_for(
        lambda: _ready(cluster, lost) != "True" and note("NotReady"),
        NODE_LOSS_TIMEOUT_S,
        f"{lost} to go NotReady",
        diagnose,
    )

    def tainted() -> bool:
        taints = _node(cluster, lost)["spec"].get("taints") or []
        return any(
            t["key"] == "node.kubernetes.io/unreachable" and t["effect"] == "NoExecute"
            for t in taints
        ) and note("NoExecute taint")

    wait_for(tainted, NODE_LOSS_TIMEOUT_S, f"the NoExecute taint on {lost}", diagnose)

    def evicted() -> bool:
        p = objects.pod(cluster, ns, first["metadata"]["name"])
        lone = objects.pod(cluster, ns, "lone")
        return (
            (p is None or bool(p["metadata"].get("deletionTimestamp")))
            and (lone is None or bool(lone["metadata"].get("deletionTimestamp")))
            and note("evicted")
        )

    wait_for(evicted, NODE_LOSS_TIMEOUT_S, f"the pods of {lost} to be evicted", diagnose)
    replacement = wait_for(
        lambda: mover_running_on(survivor),
        NODE_LOSS_TIMEOUT_S,
        f"a replacement on {survivor}",
        diagnose,
    )
    note("replacement Running")
    wait_for(
        lambda: (answer := _dns(cluster, record))
        and replacement["status"]["podIP"] in answer
        and first["status"]["podIP"] not in answer,
        60,
        f"{record} to name the replacement only",
    )

    # The machine boots again: the node rejoins, the evicted pods go for good, and it runs pods.
    t1 = time.monotonic()
    r = cluster.script("start-node", "2")
    assert r.returncode == 0, r.stderr
    rejoined_s = time.monotonic() - t1
    assert _ready(cluster, lost) == "True"
    wait_for(  # lifted on the controller's next pass over the node
        lambda: not _node(cluster, lost)["spec"].get("taints"),
        60,
        f"{lost}'s taints to go",
        diagnose,
    )
    wait_for(
        lambda: objects.pod(cluster, ns, "lone") is None
        and objects.pod(cluster, ns, first["metadata"]["name"]) is None,
        120,
        "the evicted pods to be gone",
        diagnose,
    )
    # Both nodes run pods again, each in its own engine and pod range (a restarted kubelet
    # must not take over another node's runtime).
    manifest = ""
    for i, node in enumerate(cluster.nodes):
        manifest += f"""
---
apiVersion: v1
kind: Pod
metadata: {{name: after-{i}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: "{node}"}}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: c, image: {objects.BUSYBOX}, imagePullPolicy: Never, command: {json.dumps(objects.SLEEPER)}}}
"""
    objects.apply(cluster, ns, manifest, tmp_path)
    prefix = cluster.range_prefix
    for i, node in enumerate(cluster.nodes):
        after = objects.running(cluster, ns, f"after-{i}")
        assert after["spec"]["nodeName"] == node
        assert after["status"]["podIP"].startswith(f"{prefix}.{i + 1}."), after["status"]
        cid = after["status"]["containerStatuses"][0]["containerID"].split("//")[1]
        assert cluster.docker_on(node, "inspect", "-f", "{{.State.Running}}", cid).strip() == "true"
    print(
        "node loss (t=0 at the kill): "
        + ", ".join(f"{what} {s:.1f} s" for what, s in times.items())
        + f"; start-node -> Ready {rejoined_s:.1f} s"
    )


# What start-node.sh makes on the host (its names; scripts/k8s/README.md lists them).
BRIDGES = re.compile(r"^(edlcluster0|edlpod[0-9]+|edldocker[0-9]+)$")
RULE_MARKS = ("elasticdl-cluster", "KUBE-", "CNI-")
# Set by the start-node.sh sweep on stderr when it removed what an earlier cluster left.
SWEEP_MESSAGE = "removed what an earlier cluster left"


def _netns_of(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _links() -> dict[str, str]:
    """{interface: its master bridge or ''}."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    links = {}
    for line in out.splitlines():
        name = line.split(": ", 2)[1].split("@")[0]
        master = re.search(r" master (\S+)", line)
        links[name] = master.group(1) if master else ""
    return links


def _iptables() -> str:
    return subprocess.run(["iptables-save"], capture_output=True, text=True).stdout


def _cgroup_root() -> str:
    return os.environ.get("ELASTICDL_NODE_CGROUP", "/elasticdl-node")


def _hostport_pods(cluster, ns: str, tmp_path) -> tuple[set[str], set[str]]:
    """Something of every kind: pods on the pod network of each node (network namespaces,
    veths, IPAM), each with a hostPort (the portmap plugin's chains), a ClusterIP Service
    (kube-proxy's chains). Returns the pods' network namespaces and veths."""
    manifest = """
apiVersion: v1
kind: Service
metadata: {name: kept}
spec: {selector: {app: kept}, ports: [{port: 80, targetPort: 8080}]}
"""
    for i, node in enumerate(cluster.nodes):
        manifest += f"""
---
apiVersion: v1
kind: Pod
metadata: {{name: p{i}, labels: {{app: kept}}}}
spec:
  nodeName: "{node}"
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {objects.BUSYBOX}
    imagePullPolicy: Never
    ports: [{{containerPort: 8080, hostPort: {31000 + i}}}]
    command: {json.dumps(objects.SLEEPER)}
"""
    objects.apply(cluster, ns, manifest, tmp_path)
    namespaces = set()
    for i, node in enumerate(cluster.nodes):
        objects.running(cluster, ns, f"p{i}")
        cid = objects.pod(cluster, ns, f"p{i}")["status"]["containerStatuses"][0]["containerID"]
        pid = int(cluster.docker_on(node, "inspect", "-f", "{{.State.Pid}}", cid.split("//")[1]))
        namespaces.add(_netns_of(pid))
    veths = {n for n, master in _links().items() if BRIDGES.match(master)}
    assert len(veths) >= len(cluster.nodes), _links()
    saved = _iptables()
    assert (
        "KUBE-SERVICES" in saved and "CNI-HOSTPORT-DNAT" in saved and "elasticdl-cluster" in saved
    )
    return namespaces, veths


def _leftovers(
    state: Path, prefix: str, pids: list[int], namespaces: set[str], veths: set[str]
) -> list[str]:
    """Whatever of the cluster is left on the machine (``prefix``: its /16 as "A.B.")."""
    left = []
    alive = [p for p in pids if process_running(p)]
    left += [f"recorded processes {alive}"] if alive else []
    for pid in _all_pids():
        if not process_running(pid):
            continue
        cmdline = _cmdline(pid)
        if f"{state}/" in cmdline:
            left.append(f"process {pid}: {cmdline[:200]}")
        if _netns_of(pid) in namespaces:
            left.append(f"process {pid} in a pod's network namespace")
    with open("/proc/self/mountinfo") as f:
        mounts = f.read()
    left += [f"mount {ln.split()[4]}" for ln in mounts.splitlines() if f" {state}/" in ln]
    left += [
        f"mount {m}"
        for m in ("/var/lib/kubelet", "/var/log/pods", "/var/log/containers")
        if os.path.ismount(m)
    ]
    for ns_id in namespaces:  # a network namespace kept by a bind mount
        inode = ns_id.split("[")[-1].rstrip("]")
        if f"net:[{inode}]" in mounts:
            left.append(f"bind-mounted network namespace {ns_id}")
    links = _links()
    left += [f"link {n}" for n in links if BRIDGES.match(n) or n in veths]
    routes = subprocess.run(
        ["ip", "route", "show", "table", "all"], capture_output=True, text=True
    ).stdout
    left += [f"route {ln}" for ln in routes.splitlines() if prefix in ln]
    left += [
        f"iptables {ln}"
        for ln in _iptables().splitlines()
        if any(m in ln for m in RULE_MARKS) or prefix in ln
    ]
    cgroup = _cgroup_root()
    left += [
        f"cgroup {h}{cgroup}"
        for h in Path("/sys/fs/cgroup").glob("*")
        if (Path(f"{h}{cgroup}")).exists()
    ]
    left += ["/run/elasticdl-node.owner"] if Path("/run/elasticdl-node.owner").exists() else []
    return left


def test_stop_leaves_nothing_behind(exclusive_cluster, node_namespace, tmp_path):
    cluster, ns = exclusive_cluster, node_namespace
    state = cluster.state_dir
    prefix = cluster.range_prefix + "."  # the cluster's /16 (read before the stop)
    namespaces, veths = _hostport_pods(cluster, ns, tmp_path)
    pids = [int(f.read_text()) for f in (state / "run").glob("*.pid")]
    assert pids

    r = cluster.script("stop")
    assert r.returncode == 0, r.stderr

    left = _leftovers(state, prefix, pids, namespaces, veths)
    assert not left, "left after stop:\n" + "\n".join(left)
    # (exclusive_cluster starts it again for the other tests)


def _tags(cluster, repository: str) -> list[str]:
    """The tags the cluster's registry holds for REPOSITORY ([] where it holds none)."""
    r = subprocess.run(
        ["curl", "-s", f"http://{cluster.registry}/v2/{repository}/tags/list"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(r.stdout).get("tags") or []


def _has_image(cluster, node: str, image: str) -> bool:
    return bool(cluster.docker_on(node, "images", "-q", image).strip())


def test_the_registry_and_its_pulled_copies_outlive_a_stop_within_their_bound(exclusive_cluster):
    cluster = exclusive_cluster
    r = cluster.script("start")  # (up again: the test before stopped it)
    assert r.returncode == 0, r.stderr
    repository = f"edl-kept-{os.getpid()}"
    image = f"{cluster.registry}/{repository}:v1"
    cluster.docker("tag", "local/busybox:node", image)
    cluster.docker("push", image)
    cluster.pull_everywhere(image)
    node2 = cluster.nodes[1]

    for command in ("stop", "start"):
        r = cluster.script(command)
        assert r.returncode == 0, r.stderr
    assert _tags(cluster, repository) == ["v1"]
    assert _has_image(cluster, node2, image), "node 2's pulled copy went with the stop"

    # Above its bound the kept registry is emptied at the next start, and the copies go.
    assert cluster.script("stop").returncode == 0
    r = cluster.script("start", env={"ELASTICDL_NODE_REGISTRY_KEEP_MB": "0"})
    assert r.returncode == 0, r.stderr
    assert "ELASTICDL_NODE_REGISTRY_KEEP_MB=0): emptied" in r.stderr, r.stderr
    assert _tags(cluster, repository) == []
    assert not _has_image(cluster, node2, image)
    assert not _has_image(cluster, cluster.nodes[0], image)


def _ifindex(link: str) -> int | None:
    try:
        return int(Path(f"/sys/class/net/{link}/ifindex").read_text())
    except OSError:
        return None


def _kill_hard(cluster) -> list[int]:
    """Every process of the cluster gets SIGKILL and its run dir goes, as after a crash (or an
    older version of the script that removed it): only what it left on the machine tells
    what it added. Returns the pids killed."""
    state = cluster.state_dir
    pids = set()
    for f in (state / "run").glob("*.pid"):
        try:
            pids.add(int(f.read_text()))
        except (OSError, ValueError):
            pass
    freezer = Path("/sys/fs/cgroup/freezer" + _cgroup_root())
    for procs in freezer.rglob("cgroup.procs"):
        pids.update(int(p) for p in procs.read_text().split())
    pids.update(p for p in _all_pids() if f"{state}/" in _cmdline(p))
    pids.discard(os.getpid())
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    wait_for(lambda: not [p for p in pids if process_running(p)], 60, "the killed processes to go")
    subprocess.run(["rm", "-rf", str(state / "run")], check=True)
    return sorted(pids)


class _Docker0:
    """The machine's ``docker0`` (the default bridge of another Docker engine, such as the one
    of the image tests): an engine configured without a bridge deletes it at its start. Where
    there is none, the test makes one (no address: an engine adopting it meanwhile would give
    it one) and removes it afterwards only if it is still that bare bridge."""

    def __init__(self) -> None:
        self.made = False
        if _ifindex("docker0") is None:
            subprocess.run(["ip", "link", "add", "docker0", "type", "bridge"], check=True)
            self.made = True
        self.index = _ifindex("docker0")

    def assert_kept(self, when: str) -> None:
        assert _ifindex("docker0") == self.index, f"docker0 deleted (or made again) {when}"

    def close(self) -> None:
        if not self.made or _ifindex("docker0") != self.index:
            return
        addrs = subprocess.run(
            ["ip", "-o", "addr", "show", "dev", "docker0"], capture_output=True, text=True
        ).stdout
        ports = subprocess.run(
            ["ip", "-o", "link", "show", "master", "docker0"], capture_output=True, text=True
        ).stdout
        if " inet " not in addrs and not ports.strip():
            subprocess.run(["ip", "link", "del", "docker0"], check=False)


def test_a_cluster_killed_hard_is_cleaned_up_by_start_and_by_stop(exclusive_cluster, tmp_path):
    cluster = exclusive_cluster
    state = cluster.state_dir
    docker0 = _Docker0()
    try:
        # (up again: the test before stopped it)
        r = cluster.script("start")
        assert r.returncode == 0, r.stderr
        docker0.assert_kept("by the nodes' engines starting")
        # Each node's engine has a default bridge of its own, not none (which deletes docker0).
        for i, node in enumerate(cluster.nodes, 1):
            bridge = cluster.docker_on(
                node,
                "network",
                "inspect",
                "bridge",
                "-f",
                '{{index .Options "com.docker.network.bridge.name"}}',
            ).strip()
            assert bridge == f"edldocker{i}", bridge
        prefix = cluster.range_prefix + "."
        ns = f"edl-hard-{os.getpid()}"
        cluster.kubectl("create", "namespace", ns)
        wait_for(  # ServiceAccount admission refuses pods until the account has its token
            lambda: cluster.kubectl(
                "get", "sa", "default", "-n", ns, "-o", "jsonpath={.secrets[0].name}", check=False
            ).strip(),
            60,
            f"the token of {ns}'s default account",
        )
        namespaces, veths = _hostport_pods(cluster, ns, tmp_path)

        killed = _kill_hard(cluster)
        saved = _iptables()
        # what the crash left: the tagged rules (the apiserver's loopback door among them),
        # kube-proxy's and portmap's chains, the bridges, the range's route
        assert "elasticdl-cluster" in saved and "KUBE-SERVICES" in saved, saved
        assert _ifindex("edlcluster0") is not None
        assert not (state / "run").exists()

        r = cluster.script("start")
        assert r.returncode == 0, r.stderr
        assert SWEEP_MESSAGE in r.stderr, r.stderr
        # start returns with every node Ready; a kubelet may still report NotReady once soon
        # after a crash's clean-up (its Ready condition says why), and is Ready again.
        for node in cluster.nodes:
            wait_for(
                lambda node=node: _ready(cluster, node) == "True",
                60,
                f"node {node} Ready after the start",
                lambda node=node: json.dumps(_node(cluster, node)["status"].get("conditions")),
            )
        docker0.assert_kept("by a start after a crash")

        # Killed hard again, then only `stop`: no records, the same result as a clean stop.
        killed += _kill_hard(cluster)
        r = cluster.script("stop")
        assert r.returncode == 0, r.stderr
        left = _leftovers(state, prefix, killed, namespaces, veths)
        assert not left, "left after a crash and stop:\n" + "\n".join(left)
        docker0.assert_kept("by stop")
    finally:
        docker0.close()
    # (exclusive_cluster starts the cluster again for the other tests)


def _failing_dockerd(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``dockerd`` fails its first ``$FAILS`` starts per engine (counted by
    its arguments: each node's engine has its own config file), then runs the real one."""
    real = shutil.which("dockerd")
    assert real, "no dockerd on PATH"
    bin_dir, counts = tmp_path / "bin", tmp_path / "counts"
    bin_dir.mkdir(parents=True)
    counts.mkdir(parents=True)
    wrapper = bin_dir / "dockerd"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'c="{counts}/$(echo "$*" | md5sum | cut -c1-8)"\n'
        'n=$(cat "$c" 2>/dev/null || echo 0); echo $((n + 1)) >"$c"\n'
        'if [ "$n" -lt "$FAILS" ]; then\n'
        '  echo "level=fatal msg=\\"start failure $n of the test\\"" >&2; exit 1\n'
        "fi\n"
        f'exec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_an_engine_exiting_while_starting_is_started_again_and_one_that_keeps_exiting_fails_at_once(
    exclusive_cluster, tmp_path
):
    cluster = exclusive_cluster
    logs = cluster.state_dir / "logs"
    r = cluster.script("stop")  # (stopped by the test before; idempotent)
    assert r.returncode == 0, r.stderr
    try:
        env = _failing_dockerd(tmp_path / "once")
        r = cluster.script("start", env={**env, "FAILS": "1"})
        assert r.returncode == 0, r.stderr
        for i in range(1, len(cluster.nodes) + 1):
            assert f"dockerd of node {i} exited while starting" in r.stderr, r.stderr
            assert "start failure 0 of the test" in (logs / f"dockerd-{i}.exited-1.log").read_text()
            assert cluster.docker_on(cluster.nodes[i - 1], "info", "-f", "{{.ID}}").strip()
        for node in cluster.nodes:
            wait_for(lambda node=node: _ready(cluster, node) == "True", 60, f"node {node} Ready")
        r = cluster.script("stop")
        assert r.returncode == 0, r.stderr

        env = _failing_dockerd(tmp_path / "always")
        started = time.monotonic()
        r = cluster.script("start", env={**env, "FAILS": "99"})
        took = time.monotonic() - started
        assert r.returncode != 0
        last = r.stderr.strip().splitlines()[-1]
        assert re.fullmatch(
            r"start-node: error: dockerd of node 1 exited while starting \(2 restarts\); its log, "
            r"kept in \S+dockerd-1\.not-ready\.log, ends: .*start failure 2 of the test.*",
            last,
        ), r.stderr
        assert took < 60, f"the start failed after {took:.0f} s, not at once"
    finally:
        cluster.script("stop")
        for kept in list(logs.glob("dockerd-*.exited-*.log")) + list(
            logs.glob("dockerd-*.not-ready.log")
        ):
            kept.unlink()
    # (exclusive_cluster starts the cluster again for the other tests)
