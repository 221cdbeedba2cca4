"""What the real one-node Kubernetes cluster costs a job, measured in one run:

    python benchmarks/k8s/node_overhead.py [--repeats 3] [--pods 5] [--records 2048]

1. pod creation -> Running: a busybox pod (the node's own ``local/busybox:node``) created
   through the API server until the kubelet reports it Running, ``--pods`` times;
2. job submit -> first task trained, and 3. the small job's wall time (submit -> Succeeded),
   on the real node (master, PS and workers in containers) and on the local platform
   (processes), alternating, ``--repeats`` times each. Same data (``--records`` Fashion-MNIST
   records, 1 epoch), same flags, same client (``elasticdl train`` in this process, polled
   through its backend every 0.1 s).

The node is the one ``scripts/k8s/start-node.sh start`` runs (started if needed, never
stopped: other users may share it). The job's image is built once, before timing, from
``--image_base`` (default ``elasticdl:cpu``, which ``deploy/docker/build-images.sh cpu`` puts in
the node's engine, see README "Running on Kubernetes") and the model zoo, as ``train
--image_base`` does. Prints a table of every run and one JSON line of medians and the ratios
node / local. Figures: benchmarks/k8s/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import cluster
from timed_job import time_job

TOOL = "node_overhead"
POLL_S = 0.1


def pod_start_seconds(core, namespace: str, count: int) -> list[float]:
    from kubernetes import client

    times = []
    for i in range(count):
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name=f"bench-{i}"),
            spec=client.V1PodSpec(
                restart_policy="Never",
                containers=[
                    client.V1Container(
                        name="main",
                        image="local/busybox:node",
                        image_pull_policy="Never",
                        command=["sleep", "3600"],
                    )
                ],
            ),
        )
        t0 = time.monotonic()
        core.create_namespaced_pod(namespace, pod)
        while core.read_namespaced_pod(f"bench-{i}", namespace).status.phase != "Running":
            if time.monotonic() - t0 > 120:
                sys.exit(f"node_overhead: pod bench-{i} not Running after 120 s")
            time.sleep(POLL_S / 2)
        times.append(time.monotonic() - t0)
        core.delete_namespaced_pod(f"bench-{i}", namespace, grace_period_seconds=0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pods", type=int, default=5)
    parser.add_argument("--records", type=int, default=2048)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--image_base", default="elasticdl:cpu")
    args = parser.parse_args()

    from elasticdl.data.datasets import prepare

    env = cluster.node_env(TOOL)
    tmp = Path(tempfile.mkdtemp(prefix="elasticdl-k8s-bench-"))
    os.environ["ELASTICDL_HOME"] = str(tmp / "home")
    try:
        with cluster.namespace(TOOL, env) as (core, namespace):
            data = tmp / "data"
            prepare("fashion_mnist", str(data), progress=False, limit=args.records)
            cluster.make_readable(tmp)
            image, zoo = cluster.build_mnist_image(env, args.image_base, tmp)
            _measure(args, env, core, namespace, image, zoo, data)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _measure(args, env, core, namespace, image, zoo, data) -> None:
    from elasticdl.jobs.platforms import platform_backend

    pods = pod_start_seconds(core, namespace, args.pods)
    common = [
        "train",
        f"--model_def={cluster.MODEL_DEF}",
        "--num_epochs=1",
        "--minibatch_size=32",
        "--num_minibatches_per_task=2",
        "--num_ps_pods=1",
        f"--num_workers={args.workers}",
    ]
    node_argv = (
        common
        + ["--training_data=/data/train"]
        + cluster.node_job_argv(
            env, image, namespace, f"host_path={data},mount_path=/data", network="host"
        )
    )
    local_argv = common + [
        "--platform=local",
        f"--model_zoo={zoo}",
        f"--training_data={data / 'train'}",
    ]
    node_backend = platform_backend("kubernetes", namespace)
    local_backend = platform_backend("local")
    runs = {"node": [], "local": []}
    for i in range(args.repeats):
        for where, backend, argv in (
            ("local", local_backend, local_argv),
            ("node", node_backend, node_argv),
        ):
            run = time_job(TOOL, backend, argv, f"bench-{where}-{i}", timeout_s=1200)
            first, total = run.first_task_s, run.job_s
            runs[where].append((first, total))
            print(
                f"{where:5s} run {i}: submit -> first task trained {first:6.1f} s, "
                f"submit -> Succeeded {total:6.1f} s",
                flush=True,
            )
            if where == "node":
                cluster.cli(TOOL, "cancel", f"bench-{where}-{i}", f"--namespace={namespace}")
    med = statistics.median
    result = {
        "pod_create_to_running_s": round(med(pods), 2),
        "node_first_task_s": round(med(r[0] for r in runs["node"]), 1),
        "local_first_task_s": round(med(r[0] for r in runs["local"]), 1),
        "node_job_s": round(med(r[1] for r in runs["node"]), 1),
        "local_job_s": round(med(r[1] for r in runs["local"]), 1),
        "records": args.records,
        "workers": args.workers,
        "repeats": args.repeats,
    }
    result["first_task_ratio"] = round(
        result["node_first_task_s"] / result["local_first_task_s"], 2
    )
    result["job_ratio"] = round(result["node_job_s"] / result["local_job_s"], 2)
    print(f"pods: create -> Running {', '.join(f'{t:.2f}' for t in pods)} s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
