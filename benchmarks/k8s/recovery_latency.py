"""How fast a job on the real node recovers from a killed worker, beside the same
measure on the local platform in the same run:

    python benchmarks/k8s/recovery_latency.py [--kills 10] [--files 4] [--kill docker|delete]
                                              [--local_kills 10]

One training job (the README model and flags: 1 PS + 2 workers, minibatch 64, 2 minibatches
per task; ``--files`` Fashion-MNIST shards of 4,096 records, epochs enough for every kill) runs
on the node ``scripts/k8s/start-node.sh`` runs, its master restartable (``--job_dir`` on a
hostPath volume), so the master journals every transition there. Every time the job trains
again after the last recovery, the benchmark kills a worker that holds a task -- ``docker
kill`` of its container (as a node losing the process: the kubelet sees it die, exit 137) or,
with ``--kill delete``, deleting its pod (as an eviction) -- and measures per kill, from the
kill:

* **re-queued**: until the master's journal records the worker's tasks back in the queue;
* **replacement Running**: until the pod of the worker the master launched in its place is
  Running (the API server's view, polled every 0.1 s);
* **replacement trained**: until the journal records that worker's first finished task.

The journal (``<job dir>/journal/*.log`` on the host) is read every 20 ms, so its times are
late by up to that. Before the node job, ``benchmarks/runtime/recovery_latency.py`` runs the
local figures (``--local_kills``, 0 to skip) on the same machine; the JSON line gives the
medians, maxima and the ratios node / local. Figures: benchmarks/k8s/README.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import cluster
from recovery import JournalTail, Kill, RecoveryTimeout, measure_kills

TOOL = "recovery_latency"


def _local_figures(args) -> dict:
    """benchmarks/runtime/recovery_latency.py, in this process (its name is this file's)."""
    runtime = cluster.REPO / "benchmarks" / "runtime"
    sys.path.append(str(runtime))  # its `import common`
    spec = importlib.util.spec_from_file_location(
        "runtime_recovery_latency", runtime / "recovery_latency.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    local = argparse.Namespace(kills=args.local_kills, files=args.files, data=args.data)
    print(f"local platform, {args.local_kills} kills:", flush=True)
    return module.run(local)


def _node_figures(args, env: dict[str, str], tmp: Path) -> list[Kill]:
    from elasticdl.k8s import security

    train = tmp / "data" / "train"
    train.mkdir(parents=True)
    shards = sorted(p for p in (Path(args.data) / "train").iterdir() if p.is_file())
    for shard in shards[: args.files]:
        shutil.copy(shard, train / shard.name)
    volume = tmp / "volume"
    volume.mkdir()
    os.chown(volume, security.RUN_AS_USER, security.RUN_AS_GROUP)  # the master writes its job
    cluster.make_readable(tmp / "data")
    tmp.chmod(0o755)

    def docker(*argv: str) -> None:
        subprocess.run(["docker", *argv], check=True, capture_output=True, env=os.environ)

    with cluster.namespace(TOOL, env) as (core, namespace):
        image, _ = cluster.build_mnist_image(env, args.image_base, tmp)
        job = "bench-recovery"
        argv = [
            "train",
            f"--model_def={cluster.MODEL_DEF}",
            "--training_data=/data/train",
            "--minibatch_size=64",
            "--num_minibatches_per_task=2",
            "--num_epochs=1000",  # cancelled once the kills are measured
            "--num_ps_pods=1",
            "--num_workers=2",
            f"--relaunch_on_worker_failure={args.kills + 1}",
            "--job_dir=/volume/job",
            f"--job_name={job}",
            "--detach",
            *cluster.node_job_argv(
                env,
                image,
                namespace,
                f"host_path={tmp / 'data'},mount_path=/data;host_path={volume},mount_path=/volume",
                network="host",
            ),
        ]
        print(f"real node, {args.kills} kills ({args.kill}):", flush=True)
        cluster.cli(TOOL, *argv)
        journal = JournalTail(volume / "job" / "journal")
        try:
            return measure_kills(core, namespace, job, journal, args.kills, args.kill, docker)
        except RecoveryTimeout as e:
            sys.exit(f"{TOOL}: {e}")
        finally:
            cluster.cli(TOOL, "cancel", job, f"--namespace={namespace}")


def _summary(values: list[float], scale: float = 1.0, digits: int = 2) -> tuple[float, float]:
    return round(statistics.median(values) * scale, digits), round(max(values) * scale, digits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--local_kills", type=int, default=10, help="0: no local figures")
    parser.add_argument("--kill", choices=("docker", "delete"), default="docker")
    parser.add_argument("--files", type=int, default=4, help="training shards (4,096 records)")
    parser.add_argument("--image_base", default="elasticdl:cpu")
    parser.add_argument(
        "--data",
        default=os.path.expanduser("~/.cache/elasticdl/bench/fashion_mnist"),
        help="prepared Fashion-MNIST (the runtime benchmarks' cache)",
    )
    args = parser.parse_args()
    if args.kills < 1 or args.local_kills < 0 or args.files < 1:
        parser.error("--kills and --files must be >= 1, --local_kills >= 0")

    from elasticdl.data.datasets import prepare

    prepare("fashion_mnist", args.data, progress=False)
    load = os.getloadavg()[0]
    local = _local_figures(args) if args.local_kills else None
    env = cluster.node_env(TOOL)
    tmp = Path(tempfile.mkdtemp(prefix="elasticdl-k8s-recovery-"))
    os.environ["ELASTICDL_HOME"] = str(tmp / "home")
    try:
        rows = _node_figures(args, env, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result: dict = {"benchmark": "k8s_recovery_latency", "kill": args.kill, "kills": len(rows)}
    result["requeue_ms_median"], result["requeue_ms_max"] = _summary(
        [r.requeued_s for r in rows], 1000, 0
    )
    result["running_s_median"], result["running_s_max"] = _summary([r.running_s for r in rows])
    result["trained_s_median"], result["trained_s_max"] = _summary([r.trained_s for r in rows])
    if local:
        result["local_requeue_ms_median"] = local["requeue_ms_median"]
        result["local_trained_s_median"] = local["replacement_training_s_median"]
        result["requeue_ratio"] = round(result["requeue_ms_median"] / local["requeue_ms_median"], 1)
        result["trained_ratio"] = round(
            result["trained_s_median"] / local["replacement_training_s_median"], 1
        )
    result["loadavg"] = [round(load, 1), round(os.getloadavg()[0], 1)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
