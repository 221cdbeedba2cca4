""""ElasticDL on a PC", end to end on the REAL node, as a user types it:

1. ``deploy/docker/build-images.sh cpu`` builds the CPU base image (the project's wheels +
   TensorFlow, offline from the host's wheel cache) in the node's engine;
2. ``elasticdl zoo init`` / ``zoo build --image=<node registry>/elasticdl:mnist_ps .`` /
   ``zoo push`` make the model-zoo image of ``model_zoo/mnist`` and push it to the node's
   registry;
3. ``elasticdl train --image_name=... --volume="host_path=<data>,mount_path=/data" ...`` with the
   PS strategy on a small Fashion-MNIST subset: the master pod starts the PS and two workers as
   real containers in the default ``pod`` network mode, with no override: each pod on its
   node's pod range, the workers on both nodes, reaching the PS by its Service's DNS name and
   the master the API server through the ``kubernetes`` Service; the job trains every record
   once to an accuracy well above chance; ``elasticdl status`` / ``logs`` / ``wait`` /
   ``cancel`` work on it.

Everything runs in real containers: nothing of the job runs in this process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from elasticdl.client import (  # noqa: F401  (main imports it by name; this makes it a dependency)
    zoo,
)
from elasticdl.client.main import main
from elasticdl.data.datasets import prepare
from elasticdl.k8s import security
from elasticdl.k8s.termination import read_termination
from elasticdl_tests.k8s_node.node import repo_root
from elasticdl_tests.waiting import wait_for

TRAIN_RECORDS = 1024
TEST_RECORDS = TRAIN_RECORDS  # prepare(limit=...) keeps that many rows of each split
RECORDS_PER_SHARD = 128
EPOCHS = 2
MINIBATCH = 32


@pytest.fixture
def cli_env(k8s_node, tmp_path, monkeypatch):
    """The client's environment: the node's kubeconfig and engine, a private ELASTICDL_HOME."""
    monkeypatch.setenv("KUBECONFIG", k8s_node.kubeconfig)
    monkeypatch.setenv("DOCKER_HOST", k8s_node.docker_host)
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path / "home"))
    for var in ("ELASTICDL_CONFIG", "ELASTICDL_K8S_POD_LOG_DIR", "DOCKER_TLS_VERIFY"):
        monkeypatch.delenv(var, raising=False)
    return k8s_node


def _rbac(node, namespace: str, capsys) -> None:
    """`elasticdl rbac --namespace=<ns> | kubectl apply -f -`: the master runs as the
    namespace's ServiceAccount elasticdl."""
    capsys.readouterr()
    assert main(["rbac", f"--namespace={namespace}"]) == 0
    path = node.state_dir / f"rbac-{namespace}.yaml"
    path.write_text(capsys.readouterr().out)
    try:
        node.kubectl("apply", "-f", str(path))
    finally:
        path.unlink()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """A small Fashion-MNIST on the host, mounted into every pod at /data."""
    data = tmp_path_factory.mktemp("node-data")
    prepared = prepare(
        "fashion_mnist",
        str(data),
        progress=False,
        limit=TRAIN_RECORDS,
        records_per_shard=RECORDS_PER_SHARD,
    )
    assert prepared.counts["train"] == TRAIN_RECORDS
    assert prepared.counts["test"] == TEST_RECORDS
    # The pods run as the non-root user 10001 (--pod_security=restricted): a hostPath keeps its
    # owner and mode, so the data must be readable by others (deploy/k8s/README.md).
    _make_readable(data)
    return data


def _make_readable(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | (0o555 if path.is_dir() else 0o444))


def _checkpoint_dir(tmp_path: Path) -> Path:
    """A checkpoint directory for the restricted pods: owned by their user (chown 10001:10001)."""
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    os.chown(directory, security.RUN_AS_USER, security.RUN_AS_GROUP)
    return directory


@pytest.fixture(scope="module")
def mnist_image(k8s_node, base_image, tmp_path_factory):
    """``zoo init`` / ``zoo build --image=<registry>/elasticdl:mnist_ps .`` / ``zoo push`` from
    a checkout-like directory holding model_zoo/mnist: (image, context dir, build seconds)."""
    base, _ = base_image
    ctx = tmp_path_factory.mktemp("zoo-ctx")
    shutil.copytree(
        repo_root() / "model_zoo" / "mnist",
        ctx / "model_zoo" / "mnist",
        ignore=shutil.ignore_patterns("__pycache__", "BUILD", "*_test.py"),
    )
    image = f"{k8s_node.registry}/elasticdl:mnist_ps"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCKER_HOST", k8s_node.docker_host)
        mp.delenv("DOCKER_TLS_VERIFY", raising=False)
        mp.chdir(ctx)
        assert main(["zoo", "init", f"--base_image={base}", "--model_zoo=model_zoo"]) == 0
        t0 = time.monotonic()
        assert main(["zoo", "build", f"--image={image}", "."]) == 0
        build_s = time.monotonic() - t0
        assert main(["zoo", "push", image]) == 0
    # The other nodes' engines pull it now, not when a pod lands there (2.5 GB).
    k8s_node.pull_everywhere(image)
    tags = json.loads(
        subprocess.run(
            ["curl", "-sf", f"http://{k8s_node.registry}/v2/elasticdl/tags/list"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert "mnist_ps" in tags["tags"]
    try:
        yield image, ctx, build_s
    finally:
        # The base image stays for the other real-node test files (conftest's base_image); the
        # other nodes keep their pulled copy (the next push is pulled again over it; what no
        # tag holds any more goes at the cluster's stop).
        k8s_node.docker("rmi", "-f", image, check=False)


def rendezvous_generations(master_log: str) -> list[tuple[int, list[int]]]:
    """An AllReduce job's groups as its master logged them: (world size, worker ids)."""
    found = re.findall(
        r"Rendezvous: generation \d+, world size (\d+), ranks \{([^}]*)\}", master_log
    )
    return [(int(size), [int(w) for w in re.findall(r"(\d+): ", ranks)]) for size, ranks in found]


def _train_argv(
    job: str,
    ns: str,
    image: str,
    data: Path,
    epochs: int,
    checkpoints: Path | None = None,
    strategy: str = "ParameterServerStrategy",
) -> list[str]:
    """The on-prem guide's `elasticdl train` command, on the cluster."""
    checkpointing = []
    if checkpoints is not None:
        checkpointing = ["--checkpoint_dir=/checkpoints", "--checkpoint_steps=16"]
    ps = ["--num_ps_pods=1"] if strategy == "ParameterServerStrategy" else []
    return [
        "train",
        *_job_argv(job, ns, image, data, checkpoints),
        "--training_data=/data/train",
        "--validation_data=/data/test",
        f"--num_epochs={epochs}",
        "--num_minibatches_per_task=2",
        *ps,
        "--num_workers=2",
        "--evaluation_steps=16",
        *checkpointing,
        f"--distribution_strategy={strategy}",
    ]


def _job_argv(
    job: str, ns: str, image: str, data: Path, checkpoints: Path | None = None
) -> list[str]:
    """What every job of these tests is given: image, zoo, resources, volumes, --detach; the
    network is the default (pod) mode."""
    volume = f"host_path={data},mount_path=/data"
    if checkpoints is not None:
        volume += f";host_path={checkpoints},mount_path=/checkpoints"
    return [
        f"--image_name={image}",
        "--model_zoo=model_zoo",
        "--model_def=mnist.mnist_functional_api.custom_model",
        # Small CPU requests: each node offers one CPU (the machine's cores split between the
        # nodes), and test files running side by side share the cluster; with bigger requests
        # a job's second worker waited Pending until the first had finished.
        "--master_resource_request=cpu=0.1,memory=1024Mi",
        "--master_resource_limit=cpu=1,memory=2048Mi",
        "--worker_resource_request=cpu=0.2,memory=1024Mi",
        "--worker_resource_limit=cpu=1,memory=2048Mi",
        "--ps_resource_request=cpu=0.1,memory=1024Mi",
        "--ps_resource_limit=cpu=1,memory=2048Mi",
        f"--minibatch_size={MINIBATCH}",
        f"--job_name={job}",
        f"--namespace={ns}",
        "--image_pull_policy=IfNotPresent",
        f"--volume={volume}",
        "--detach",
    ]


def test_mnist_ps_job_in_real_containers(
    cli_env,
    base_image,
    mnist_image,
    data_dir,
    node_namespace,
    node_k8s,
    monkeypatch,
    capsys,
    tmp_path,
):
    node = cli_env
    _, base_s = base_image
    image, ctx, zoo_s = mnist_image
    ns = node_namespace
    _rbac(node, ns, capsys)
    monkeypatch.chdir(ctx)
    capsys.readouterr()

    job = f"mnist-{uuid.uuid4().hex[:4]}"
    checkpoints = _checkpoint_dir(tmp_path)
    t_submit = time.monotonic()
    rc = main(_train_argv(job, ns, image, data_dir, EPOCHS, checkpoints))
    assert rc == 0, capsys.readouterr().err[-3000:]
    target = [f"--namespace={ns}", "--platform=kubernetes"]
    pods = [f"elasticdl-{job}-{r}" for r in ("master", "ps-0", "worker-0", "worker-1")]

    def diagnose() -> str:
        out = node.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False)
        for pod in pods:
            out += f"\n--- {pod} ---\n" + node.kubectl(
                "logs", "-n", ns, pod, "--tail=40", check=False
            )
        return out

    def all_running() -> bool:
        master = node_k8s.get_pod(pods[0])
        if master is not None and read_termination(master).is_terminal:
            pytest.fail(f"the master ended early: {read_termination(master)}\n{diagnose()}")
        listed = node.kubectl("get", "pods", "-n", ns, "--no-headers", check=False).splitlines()
        phases = {ln.split()[0]: ln.split()[2] for ln in listed if ln.strip()}
        return all(phases.get(p) == "Running" for p in pods) and listed

    listed = wait_for(all_running, 300, "master, ps-0, worker-0 and worker-1 to run", diagnose)
    first_running_s = time.monotonic() - t_submit
    # kubectl get pods lists them as the on-prem guide shows: NAME READY STATUS RESTARTS AGE.
    assert sorted(ln.split()[:3] for ln in listed) == sorted([p, "1/1", "Running"] for p in pods)
    # The default network mode: every pod has its own address on its node's pod range, the
    # workers and the PS preferred different nodes, and the workers were told the PS by its
    # Service name (resolved by the cluster DNS, not an address the master looked up).
    placed = {}
    for pod in pods:
        running = node_k8s.get_pod(pod)
        node_name, ip = running.spec.node_name, running.status.pod_ip
        assert not running.spec.host_network, pod
        assert ip.startswith(f"{node.range_prefix}.{node.nodes.index(node_name) + 1}."), (pod, ip)
        placed[pod] = node_name
    workers_on = {placed[p] for p in pods if "-worker-" in p}
    assert workers_on == set(node.nodes[:2]), (placed, diagnose())
    worker_args = node_k8s.get_pod(pods[2]).spec.containers[0].command
    ps_address = f"elasticdl-{job}-ps-0.{ns}.svc:2222"
    assert ps_address in " ".join(worker_args), worker_args
    # Real containers of the nodes' engines.
    containers = "\n".join(
        node.docker_each(
            "ps",
            "--filter",
            f"label=io.kubernetes.pod.namespace={ns}",
            "--format",
            '{{.Label "io.kubernetes.pod.name"}} {{.Label "io.kubernetes.container.name"}}',
        ).values()
    ).split("\n")
    assert sorted(c for c in containers if c.endswith(" main")) == sorted(f"{p} main" for p in pods)
    # Restricted pods (the default --pod_security): the engine's record of every container of
    # the job says it runs as the non-root user 10001, may not gain privileges, has every
    # capability dropped, the default seccomp profile and a read-only root filesystem.
    for pod in pods:
        running = node_k8s.get_pod(pod)
        cid = running.status.container_statuses[0].container_id.split("://", 1)[1]
        (inspected,) = json.loads(node.docker_on(running.spec.node_name, "inspect", cid))
        host = inspected["HostConfig"]
        assert inspected["Config"]["User"] in ("10001", "10001:10001"), (pod, inspected["Config"])
        assert "no-new-privileges" in (host["SecurityOpt"] or []), (pod, host["SecurityOpt"])
        assert "seccomp=unconfined" not in (host["SecurityOpt"] or []), (pod, host["SecurityOpt"])
        assert host["CapDrop"] == ["ALL"] and host["ReadonlyRootfs"] is True, (pod, host)

    assert main(["status", job, *target]) == 0
    # A worker's log, read through the kubelet while it trains (the master removes the
    # replicas' pods when the job ends).
    capsys.readouterr()

    def worker_log() -> str:
        # A container that has just started may not have written anything yet.
        assert main(["logs", job, "--replica", "worker-0", *target]) == 0, diagnose()
        return capsys.readouterr().out.strip()

    wait_for(worker_log, 120, "worker-0 to write its log", diagnose)
    # A worker on the node without the PS shares no memory with it: its pushes and pulls take
    # the PS's stream channel (a TCP port of the PS pod) across the pod network.
    far = next(p for p in pods if "-worker-" in p and placed[p] != placed[pods[1]])

    def far_worker_streams() -> bool:
        replica = far.rsplit("-", 2)[-2] + "-" + far.rsplit("-", 1)[-1]
        assert main(["logs", job, "--replica", replica, *target]) == 0, diagnose()
        return "pushes and pulls go through its stream channel" in capsys.readouterr().out

    wait_for(far_worker_streams, 180, f"{far} to push through the PS's stream channel", diagnose)
    assert main(["wait", job, "--timeout=900", *target]) == 0, diagnose()
    job_s = time.monotonic() - t_submit
    capsys.readouterr()
    assert main(["logs", job, *target]) == 0
    master_log = capsys.readouterr().out

    total = TRAIN_RECORDS * EPOCHS
    assert re.search(r"Evaluation metrics\[v=\d+\]: \{'accuracy'", master_log), master_log[-3000:]
    assert f"trained {total}/{total} records" in master_log, master_log[-3000:]
    assert main(["status", job, "-o", "json", *target]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["phase"] == "Succeeded"
    assert status["records_trained"] == status["records_expected"] == total
    accuracy = status["evaluation_metrics"]["accuracy"]
    assert accuracy > 0.5, status  # 10 classes: chance is 0.1
    replicas = {r["name"]: r for r in status["replicas"]}
    assert {"ps-0", "worker-0", "worker-1"} <= set(replicas), replicas
    # The PS wrote its checkpoints to the hostPath volume as the pods' non-root user.
    written = [p for p in checkpoints.rglob("*") if p.is_file()]
    assert written, "no checkpoint written"
    assert {(p.stat().st_uid, p.stat().st_gid) for p in written} == {(10001, 10001)}

    # cancel: the finished job and everything it owned are removed.
    assert main(["cancel", job, *target]) == 0
    assert wait_for(lambda: node_k8s.list_pods() == [], 60, "the job's pods to go", diagnose)

    # evaluate and predict from the newest checkpoint on the volume, side by side.
    latest = max(
        (p for p in checkpoints.iterdir() if p.name.startswith("version-")),
        key=lambda p: int(p.name.split("-")[1]),
    )
    from_checkpoint = [f"--checkpoint_dir_for_init=/checkpoints/{latest.name}", "--num_ps_pods=1"]
    evaluated, predicted = f"{job}-eval", f"{job}-pred"
    for command, name, data in (
        ("evaluate", evaluated, "--validation_data=/data/test"),
        ("predict", predicted, "--prediction_data=/data/test"),
    ):
        argv = [command, *_job_argv(name, ns, image, data_dir, checkpoints)]
        argv += [data, "--num_workers=1", *from_checkpoint]
        assert main(argv) == 0, capsys.readouterr().err[-3000:]
    t_second = time.monotonic()
    for name in (evaluated, predicted):
        assert main(["wait", name, "--timeout=600", *target]) == 0, diagnose()
    second_s = time.monotonic() - t_second
    capsys.readouterr()
    assert main(["status", evaluated, "-o", "json", *target]) == 0
    evaluation = json.loads(capsys.readouterr().out)
    assert evaluation["phase"] == "Succeeded", evaluation
    # The restored model scores what the training job's last evaluation saw, well above chance.
    assert evaluation["evaluation_metrics"]["accuracy"] > 0.5, evaluation
    assert main(["status", predicted, "-o", "json", *target]) == 0
    prediction = json.loads(capsys.readouterr().out)
    assert prediction["phase"] == "Succeeded", prediction
    assert prediction["records_predicted"] == TEST_RECORDS, prediction
    for name in (evaluated, predicted):
        assert main(["cancel", name, *target]) == 0
    assert wait_for(lambda: node_k8s.list_pods() == [], 60, "the jobs' pods to go", diagnose)
    with capsys.disabled():
        print(
            f"\nreal-node job: base image {base_s:.0f}s, zoo build {zoo_s:.1f}s, "
            f"submit -> 4 pods Running {first_running_s:.1f}s, submit -> Succeeded {job_s:.1f}s, "
            f"{total} records, accuracy {accuracy:.3f}; evaluate + predict from {latest.name} "
            f"{second_s:.1f}s, accuracy {evaluation['evaluation_metrics']['accuracy']:.3f}"
        )


def test_allreduce_job_in_real_containers(
    cli_env, mnist_image, data_dir, node_namespace, node_k8s, monkeypatch, capsys
):
    """--distribution_strategy=AllreduceStrategy across the two nodes: two worker containers,
    one per node, build a Gloo group through the master's store over the pod network; one of
    them is killed mid-job (``docker kill`` on its node's engine), the group shrinks to the
    survivor, the master relaunches the worker and the group grows back to two; every record
    is trained once."""
    node = cli_env
    image, ctx, _ = mnist_image
    ns = node_namespace
    _rbac(node, ns, capsys)
    monkeypatch.chdir(ctx)
    job = f"allreduce-{uuid.uuid4().hex[:4]}"
    target = [f"--namespace={ns}", "--platform=kubernetes"]
    epochs = 60  # tens of seconds of work left for the relaunched worker to join
    argv = _train_argv(job, ns, image, data_dir, epochs, strategy="AllreduceStrategy")
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
    master = f"elasticdl-{job}-master"

    def diagnose() -> str:
        out = node.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False)
        for replica in ("master", "worker-0", "worker-1", "worker-2"):
            out += f"\n--- {replica} ---\n" + node.kubectl(
                "logs", "-n", ns, f"elasticdl-{job}-{replica}", "--tail=40", check=False
            )
        return out

    def master_log() -> str:
        return node_k8s.read_pod_log(master) or ""

    def grouped_on_both_nodes():
        workers = [node_k8s.get_pod(f"elasticdl-{job}-worker-{i}") for i in (0, 1)]
        if any(w is None or w.status.phase != "Running" for w in workers):
            return None
        if not any(size == 2 for size, _ in rendezvous_generations(master_log())):
            return None
        return workers

    workers = wait_for(grouped_on_both_nodes, 400, "a group of two workers", diagnose)
    assert {w.spec.node_name for w in workers} == set(node.nodes[:2]), diagnose()

    def records_trained() -> int:
        capsys.readouterr()
        assert main(["status", job, "-o", "json", *target]) == 0
        return json.loads(capsys.readouterr().out)["records_trained"]

    # Killed while the two train together (not while their group is still being built).
    wait_for(lambda: records_trained() > 0, 300, "the group of two to train", diagnose)
    victim = workers[1]
    generations_before = len(rendezvous_generations(master_log()))
    cid = victim.status.container_statuses[0].container_id.split("://", 1)[1]
    node.docker_on(victim.spec.node_name, "kill", cid)

    t_kill = time.monotonic()

    def regrouped() -> bool:
        later = rendezvous_generations(master_log())[generations_before:]
        # A generation of the survivor and the relaunched worker 2 (maybe after one of the
        # survivor alone): the survivor's collective with the dead peer ended on the master's
        # word that its generation lost a member.
        return any(size == 2 and 2 in workers for size, workers in later)

    wait_for(regrouped, 400, "the survivor and the replacement in one group", diagnose)
    regrouped_s = time.monotonic() - t_kill
    log = master_log()
    assert re.search(r"worker 0 left generation \d+ \(collective failed\)", log), log[-3000:]
    assert main(["wait", job, "--timeout=900", *target]) == 0, diagnose()
    capsys.readouterr()
    assert main(["status", job, "-o", "json", *target]) == 0
    status = json.loads(capsys.readouterr().out)
    total = TRAIN_RECORDS * epochs
    assert status["phase"] == "Succeeded", status
    assert status["records_trained"] == status["records_expected"] == total, status
    assert status["evaluation_metrics"]["accuracy"] > 0.5, status
    replicas = {r["name"]: r for r in status["replicas"]}
    assert replicas["worker-1"]["replaced_by"] == 2, replicas
    assert not any(name.startswith("ps-") for name in replicas)
    with capsys.disabled():
        print(
            f"\nAllReduce across nodes: worker killed -> regrouped with its replacement "
            f"{regrouped_s:.1f}s\n"
            + "\n".join(ln for ln in log.splitlines() if "Rendezvous" in ln or "Worker 1" in ln)
        )
    assert main(["cancel", job, *target]) == 0
    assert wait_for(lambda: node_k8s.list_pods() == [], 60, "the job's pods to go", diagnose)


def test_killed_worker_container_is_relaunched_and_nothing_is_lost(
    cli_env, mnist_image, data_dir, node_namespace, node_k8s, monkeypatch, capsys
):
    """`docker kill` of a training worker's container mid-job: the container ends with 137 and
    no OOMKilled (how a preempted replica looks), the master relaunches the worker as a new pod
    and requeues its tasks; the job still trains every record exactly once."""
    node = cli_env
    image, ctx, _ = mnist_image
    ns = node_namespace
    _rbac(node, ns, capsys)
    monkeypatch.chdir(ctx)
    epochs = 8
    total = TRAIN_RECORDS * epochs
    job = f"kill-{uuid.uuid4().hex[:4]}"
    assert main(_train_argv(job, ns, image, data_dir, epochs)) == 0
    target = [f"--namespace={ns}", "--platform=kubernetes"]

    def diagnose() -> str:
        out = node.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False)
        return (
            out
            + "\n--- master ---\n"
            + node.kubectl("logs", "-n", ns, f"elasticdl-{job}-master", "--tail=60", check=False)
        )

    def status() -> dict:
        capsys.readouterr()
        assert main(["status", job, "-o", "json", *target]) == 0
        return json.loads(capsys.readouterr().out)

    # The victim is whichever worker has completed a task while at most half the job is trained:
    # under load one worker may train most of the job while the other still imports TensorFlow,
    # and a job with no work left relaunches no worker.
    def training_worker():
        now = status()
        assert now["records_trained"] <= total // 2, (
            f"{now['records_trained']}/{total} records trained before any worker was seen "
            "training: nothing left to relaunch a worker for"
        )
        for replica in now["replicas"]:
            if replica["type"] != "worker" or replica["tasks_done"] < 1:
                continue
            pod = node_k8s.get_pod(f"elasticdl-{job}-{replica['name']}")
            if pod is not None and pod.status.phase == "Running":
                return replica["name"], pod
        return None

    victim, pod = wait_for(training_worker, 300, "a worker to complete a task", diagnose)
    cid = pod.status.container_statuses[0].container_id.split("://", 1)[1]
    node.docker_on(pod.spec.node_name, "kill", cid)
    killed = wait_for(
        lambda: (p := node_k8s.get_pod(pod.metadata.name)) is not None
        and read_termination(p).is_terminal
        and read_termination(p),
        60,
        f"{victim} to end",
        diagnose,
    )
    assert (killed.exit_code, killed.reason) == (137, "Error")
    assert main(["wait", job, "--timeout=900", *target]) == 0, diagnose()
    final = status()
    assert final["phase"] == "Succeeded", final
    assert final["records_trained"] == final["records_expected"] == total, final
    replicas = {r["name"]: r for r in final["replicas"]}
    assert replicas[victim]["exit_code"] == 137, replicas
    assert "worker-2" in replicas, (sorted(replicas), diagnose())  # the relaunched worker
    assert replicas[victim]["replaced_by"] == 2, replicas
    assert main(["cancel", job, *target]) == 0


def test_oom_killed_workers_are_relaunched_within_their_budget_and_status_says_so(
    cli_env, mnist_image, data_dir, node_namespace, node_k8s, monkeypatch, capsys
):
    """Workers whose memory limit is below what TensorFlow needs are OOM-killed by the kernel
    (exit 137, ``OOMKilled``, told apart from a preemption): each is relaunched once
    (``--relaunch_on_worker_failure=1``), not endlessly, and the job fails with every worker
    reported ``OOMKilled`` by ``elasticdl status``."""
    node = cli_env
    image, ctx, _ = mnist_image
    ns = node_namespace
    _rbac(node, ns, capsys)
    monkeypatch.chdir(ctx)
    job = f"oom-{uuid.uuid4().hex[:4]}"
    argv = _train_argv(job, ns, image, data_dir, 1)
    argv = [a for a in argv if not a.startswith("--worker_resource_")] + [
        "--worker_resource_request=cpu=0.2,memory=64Mi",
        "--worker_resource_limit=cpu=1,memory=150Mi",  # importing TensorFlow needs more
        "--relaunch_on_worker_failure=1",
    ]
    assert main(argv) == 0
    target = [f"--namespace={ns}", "--platform=kubernetes"]

    def diagnose() -> str:
        return node.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False) + (
            "\n--- master ---\n"
            + node.kubectl("logs", "-n", ns, f"elasticdl-{job}-master", "--tail=60", check=False)
        )

    capsys.readouterr()
    assert main(["wait", job, "--timeout=600", *target]) == 1, diagnose()
    assert main(["status", job, "-o", "json", *target]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["phase"] == "Failed", status
    workers = sorted(
        (r for r in status["replicas"] if r["type"] == "worker"), key=lambda r: r["id"]
    )
    # Two workers, each relaunched once: four pods, every one OOM-killed.
    assert [(r["name"], r["exit_code"], r["message"]) for r in workers] == [
        (f"worker-{i}", 137, "OOMKilled") for i in range(4)
    ], (workers, diagnose())
    assert main(["status", job, *target]) == 0
    assert "OOMKilled" in capsys.readouterr().out
    assert main(["cancel", job, *target]) == 0


def test_deleted_ps_pod_is_relaunched_and_restores_its_checkpoint(
    cli_env, mnist_image, data_dir, node_namespace, node_k8s, monkeypatch, capsys, tmp_path
):
    """Deleting the PS pod mid-job (as a node drain would): the master relaunches ps-0 under the
    same name, the new PS restores its shard from the newest checkpoint on the hostPath volume
    (written by the restricted pods' user), and the job still trains every record once."""
    node = cli_env
    image, ctx, _ = mnist_image
    ns = node_namespace
    _rbac(node, ns, capsys)
    monkeypatch.chdir(ctx)
    checkpoints = _checkpoint_dir(tmp_path)
    epochs = 4  # enough work left when the PS goes
    job = f"psdel-{uuid.uuid4().hex[:4]}"
    assert main(_train_argv(job, ns, image, data_dir, epochs, checkpoints)) == 0
    target = [f"--namespace={ns}", "--platform=kubernetes"]
    ps0 = f"elasticdl-{job}-ps-0"

    def diagnose() -> str:
        return node.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False) + (
            "\n--- master ---\n"
            + node.kubectl("logs", "-n", ns, f"elasticdl-{job}-master", "--tail=60", check=False)
        )

    def first_checkpoint():
        pod = node_k8s.get_pod(ps0)
        written = [p for p in checkpoints.rglob("*") if p.is_file()]
        return pod is not None and pod.status.phase == "Running" and written and pod

    old = wait_for(first_checkpoint, 300, "the PS's first checkpoint", diagnose)
    assert node_k8s.delete_pod(ps0)

    def restored_ps() -> str:
        pod = node_k8s.get_pod(ps0)
        if pod is None or pod.metadata.uid == old.metadata.uid or pod.status.phase != "Running":
            return ""
        log = node_k8s.read_pod_log(ps0) or ""
        return log if re.search(r"PS 0 restored version \d+ from /checkpoints", log) else ""

    wait_for(restored_ps, 300, "the relaunched ps-0 to restore its checkpoint", diagnose)
    assert main(["wait", job, "--timeout=900", *target]) == 0, diagnose()
    capsys.readouterr()
    assert main(["status", job, "-o", "json", *target]) == 0
    status = json.loads(capsys.readouterr().out)
    total = TRAIN_RECORDS * epochs
    assert status["phase"] == "Succeeded", status
    assert status["records_trained"] == status["records_expected"] == total, status
    assert main(["cancel", job, *target]) == 0
