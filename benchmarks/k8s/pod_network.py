"""The pod network against the host network: the same job on the real two-node cluster in both
network modes, interleaved, in one run:

    python benchmarks/k8s/pod_network.py [--repeats 3] [--records 4096] [--workers 2]

Per run, the README model (``mnist.mnist_functional_api.custom_model``) on ``--records``
Fashion-MNIST records, 1 epoch, 1 PS and ``--workers`` workers (minibatch 32, 2 minibatches per
task, the pods' requests and limits of ``cluster.node_job_argv``), submitted with ``--detach``
and polled through the client's backend every 0.1 s:

* **submit -> first task trained** and **submit -> Succeeded**;
* **training throughput**: records per second from the first trained task to the end (the part
  where gradients and parameters cross the network between workers and the PS).

``pod``: the default mode (each pod its own address on its node's bridge, the PS reached by its
Service's DNS name, the API server through the ``kubernetes`` Service). ``host``: every pod on
its node's network, the API server on loopback. The modes alternate, ``--repeats`` runs each;
it prints every run and one JSON line of medians with the ratios pod / host, and the load
average at the start and the end. The cluster is the one ``scripts/k8s/start-node.sh start``
runs (started if needed, never stopped). Figures: benchmarks/k8s/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from dataclasses import asdict
from pathlib import Path

import cluster
from timed_job import time_job

TOOL = "pod_network"
MODES = ("host", "pod")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--records", type=int, default=4096)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--image_base", default="elasticdl:cpu")
    args = parser.parse_args()

    from elasticdl.data.datasets import prepare
    from elasticdl.jobs.platforms import platform_backend

    load_start = os.getloadavg()[0]
    env = cluster.node_env(TOOL)
    tmp = Path(tempfile.mkdtemp(prefix="elasticdl-k8s-bench-"))
    os.environ["ELASTICDL_HOME"] = str(tmp / "home")
    try:
        with cluster.namespace(TOOL, env) as (_, namespace):
            data = tmp / "data"
            prepare("fashion_mnist", str(data), progress=False, limit=args.records)
            cluster.make_readable(tmp)
            image, _ = cluster.build_mnist_image(env, args.image_base, tmp)
            common = [
                "train",
                f"--model_def={cluster.MODEL_DEF}",
                "--training_data=/data/train",
                "--num_epochs=1",
                "--minibatch_size=32",
                "--num_minibatches_per_task=2",
                "--num_ps_pods=1",
                f"--num_workers={args.workers}",
            ]
            volume = f"host_path={data},mount_path=/data"
            backend = platform_backend("kubernetes", namespace)
            runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
            for i in range(args.repeats):
                for mode in MODES:
                    argv = common + cluster.node_job_argv(
                        env, image, namespace, volume, network=mode
                    )
                    name = f"bench-{mode}-{i}"
                    run = asdict(time_job(TOOL, backend, argv, name, timeout_s=1800))
                    cluster.cli(TOOL, "cancel", name, f"--namespace={namespace}")
                    runs[mode].append(run)
                    print(
                        f"{mode:4s} run {i}: submit -> first task {run['first_task_s']:6.1f} s, "
                        f"submit -> Succeeded {run['job_s']:6.1f} s, "
                        f"{run['records_per_s']:7.1f} records/s after the first task",
                        flush=True,
                    )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median
    result: dict[str, float] = {}
    for mode in MODES:
        for key in ("first_task_s", "job_s", "records_per_s"):
            result[f"{mode}_{key}"] = round(med(r[key] for r in runs[mode]), 1)
    for key in ("first_task_s", "job_s", "records_per_s"):
        result[f"{key}_ratio"] = round(result[f"pod_{key}"] / result[f"host_{key}"], 2)
    result.update(
        records=args.records,
        workers=args.workers,
        repeats=args.repeats,
        load_start=round(load_start, 1),
        load_end=round(os.getloadavg()[0], 1),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
