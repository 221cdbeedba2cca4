"""A worker's node dies: how long a job on the real two-node cluster takes to recover, measured
over repeated losses in one run:

    python benchmarks/k8s/node_loss.py [--repeats 3] [--files 4]

Per repeat, one job of the README model (default ``pod`` network mode, 1 PS + 2 workers,
minibatch 64, 2 minibatches per task, epochs enough to outlast the loss) with a restartable
master (``--job_dir`` on a hostPath volume, so the master's journal can be read from here); the
master and the PS stay on node 1 (``--cluster_spec_json``), the workers spread over both nodes
(ElasticDL's own preference); every pod asks for 0.2 CPU, so node 1 alone holds the whole job
once node 2 is gone. Once both workers have trained a task, ``start-node.sh stop-node
2`` kills node 2's kubelet, its engine and every container on it at once, as when a machine
dies. From that moment:

* **NotReady**: the node controller marks node 2 NotReady (after its grace period);
* **re-queued**: the master's journal records the lost worker's tasks back in the queue (the
  pod's ``--node_lost_timeout`` toleration, then the master force-deletes the pod nobody
  confirms, ``platform/k8s_lost_pods.py``);
* **replacement Running**: the worker launched in its place runs (on node 1);
* **replacement trained**: the journal records its first finished task.

Then the job is cancelled and node 2 started again (Ready) before the next repeat. Prints every
repeat and a JSON line of medians and maxima with the load average at the start and the end;
the worker-kill figures of ``recovery_latency.py`` are the comparison (the README beside this
file). The cluster is the one ``scripts/k8s/start-node.sh start`` runs; the benchmark needs it
to itself (it stops a node): run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cluster
from recovery import POD_POLL_S, JournalTail, RecoveryTimeout, follow_recovery, until, worker_pod

TOOL = "node_loss"
LOST_NODE = "2"
STEPS = ("notready_s", "requeued_s", "running_s", "trained_s")
WORKER_CPU = 0.2  # see one_loss


def _script(*args: str) -> None:
    r = subprocess.run(
        ["bash", str(cluster.REPO / "scripts" / "k8s" / "start-node.sh"), *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if r.returncode != 0:
        sys.exit(f"{TOOL}: start-node.sh {' '.join(args)} failed: {r.stderr.strip()[-500:]}")


def _ready(core, node: str) -> bool:
    conditions = core.read_node(node).status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def one_loss(args, env, core, namespace: str, image: str, data: Path, work: Path, n: int):
    from elasticdl.k8s import security

    nodes = sorted(node.metadata.name for node in core.list_node().items)
    survivor, lost = nodes[0], nodes[int(LOST_NODE) - 1]
    volume = work / f"volume-{n}"
    volume.mkdir()
    os.chown(volume, security.RUN_AS_USER, security.RUN_AS_GROUP)
    job = f"nodeloss-{n}"
    on_survivor = {"node_selector": {"kubernetes.io/hostname": survivor}}
    placement = {"master_pod_spec": on_survivor, "ps_pod_spec": on_survivor}
    argv = [
        "train",
        f"--model_def={cluster.MODEL_DEF}",
        "--training_data=/data/train",
        "--minibatch_size=64",
        "--num_minibatches_per_task=2",
        "--num_epochs=1000",  # cancelled once the recovery is measured
        "--num_ps_pods=1",
        "--num_workers=2",
        "--job_dir=/volume/job",
        f"--job_name={job}",
        f"--cluster_spec_json={json.dumps(placement)}",
        "--detach",
        *cluster.node_job_argv(
            env,
            image,
            namespace,
            f"host_path={data},mount_path=/data;host_path={volume},mount_path=/volume",
        ),
        # After the loss the surviving node (1 allocatable CPU) must hold the master, the PS
        # and both workers: 0.2 CPU each (the other benchmarks' 0.4-CPU worker leaves the
        # replacement Pending "Insufficient cpu" until the lost node is back).
        f"--worker_resource_request=cpu={WORKER_CPU},memory=1024Mi",
    ]
    cluster.cli(TOOL, *argv)
    journal = JournalTail(volume / "job" / "journal")
    try:

        def both_trained():
            journal.poll()
            if len(journal.finished) < 2:
                return None
            for worker in journal.finished:
                pod = worker_pod(core, namespace, job, worker)
                if pod is not None and pod.spec.node_name == lost:
                    return worker
            sys.exit(f"{TOOL}: no worker of {job} on node {lost}: the spread did not happen")

        victim = until(both_trained, 600, "both workers to train a task", POD_POLL_S)
        t0 = time.monotonic()
        _script("stop-node", LOST_NODE)
        t_notready = until(
            lambda: not _ready(core, lost) and time.monotonic(), 300, "NotReady", POD_POLL_S
        )

        # The lost node's pods are only confirmed gone after the toleration: a longer wait.
        step = follow_recovery(core, namespace, job, journal, victim, t0, requeue_timeout=600)
        new = step.replacement
        t_requeued, t_running, t_trained = step.requeued_at, step.running_at, step.trained_at
    except RecoveryTimeout as e:
        sys.exit(f"{TOOL}: {e}")
    finally:
        cluster.cli(TOOL, "cancel", job, f"--namespace={namespace}")
        _script("start-node", LOST_NODE)
        until(lambda: _ready(core, lost), 300, f"node {lost} Ready again", POD_POLL_S)
    row = dict(zip(STEPS, (t - t0 for t in (t_notready, t_requeued, t_running, t_trained))))
    print(
        f"loss {n + 1}: worker {victim} -> {new}: NotReady {row['notready_s']:.1f} s, "
        f"re-queued {row['requeued_s']:.1f} s, replacement Running {row['running_s']:.1f} s, "
        f"trained {row['trained_s']:.1f} s",
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--files", type=int, default=4, help="training shards (4,096 records)")
    parser.add_argument("--image_base", default="elasticdl:cpu")
    args = parser.parse_args()
    if args.repeats < 1 or args.files < 1:
        parser.error("--repeats and --files must be >= 1")

    from elasticdl.data.datasets import prepare

    load = os.getloadavg()[0]
    env = cluster.node_env(TOOL)
    work = Path(tempfile.mkdtemp(prefix="elasticdl-k8s-nodeloss-"))
    os.environ["ELASTICDL_HOME"] = str(work / "home")
    rows = []
    try:
        with cluster.namespace(TOOL, env) as (core, namespace):
            data = work / "data"
            prepare("fashion_mnist", str(data), progress=False, limit=args.files * 4096)
            cluster.make_readable(data)
            image, _ = cluster.build_mnist_image(env, args.image_base, work)
            for n in range(args.repeats):
                rows.append(one_loss(args, env, core, namespace, image, data, work, n))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result: dict = {"benchmark": "k8s_node_loss", "losses": len(rows)}
    for step in STEPS:
        values = [r[step] for r in rows]
        result[f"{step}_median"] = round(statistics.median(values), 1)
        result[f"{step}_max"] = round(max(values), 1)
    result["loadavg"] = [round(load, 1), round(os.getloadavg()[0], 1)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
