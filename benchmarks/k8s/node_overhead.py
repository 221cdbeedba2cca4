"""What the real one-node Kubernetes cluster costs a job, measured in one run (issue #15):

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
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for _path in (REPO / "model_zoo", REPO / "src" / "python"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

MODEL_DEF = "mnist.mnist_functional_api.custom_model"
POLL_S = 0.1


def _node_env() -> dict[str, str]:
    r = subprocess.run(
        ["bash", str(REPO / "scripts" / "k8s" / "start-node.sh"), "start"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if r.returncode != 0:
        sys.exit(f"node_overhead: start-node.sh start failed: {r.stderr.strip()[-300:]}")
    return dict(ln.split("=", 1) for ln in r.stdout.splitlines() if "=" in ln and " " not in ln)


def _kubectl() -> str:
    cache = os.environ.get("ELASTICDL_K8S_CACHE") or os.path.expanduser(
        "~/.cache/elasticdl/k8s-1.20.2"
    )
    return os.environ.get("ELASTICDL_K8S_BIN", os.path.join(cache, "bin")) + "/kubectl"


def _cli(*argv: str) -> str:
    from elasticdl.client.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    if rc != 0:
        sys.exit(f"node_overhead: elasticdl {argv[0]} failed: {err.getvalue().strip()[-500:]}")
    return out.getvalue()


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


def run_job(backend, argv: list[str], name: str) -> tuple[float, float]:
    """(submit -> first task trained, submit -> Succeeded) in seconds."""
    t0 = time.monotonic()
    _cli(*argv, f"--job_name={name}", "--detach")
    first = None
    while True:
        status = backend.status(name)
        if first is None and status.records_trained > 0:
            first = time.monotonic() - t0
        if status.phase in ("Succeeded", "Failed", "Cancelled"):
            break
        if time.monotonic() - t0 > 1200:
            sys.exit(f"node_overhead: job {name} did not end in 1200 s")
        time.sleep(POLL_S)
    total = time.monotonic() - t0
    if status.phase != "Succeeded" or status.records_trained != status.records_expected:
        sys.exit(f"node_overhead: job {name} {status.phase}: {status.message}")
    return first if first is not None else total, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pods", type=int, default=5)
    parser.add_argument("--records", type=int, default=2048)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--image_base", default="elasticdl:cpu")
    args = parser.parse_args()

    from elasticdl.client import zoo_image
    from elasticdl.client.backend import get_backend
    from elasticdl.data.datasets import prepare
    from kubernetes import client, config

    env = _node_env()
    os.environ.update(KUBECONFIG=env["KUBECONFIG"], DOCKER_HOST=env["DOCKER_HOST"])
    tmp = Path(tempfile.mkdtemp(prefix="elasticdl-k8s-bench-"))
    os.environ["ELASTICDL_HOME"] = str(tmp / "home")
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    config.load_kube_config(config_file=env["KUBECONFIG"])
    core = client.CoreV1Api()
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    try:
        data = tmp / "data"
        prepare("fashion_mnist", str(data), progress=False, limit=args.records)
        for path in [tmp, data, *data.rglob("*")]:  # the pods run as user 10001
            path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))
        zoo = tmp / "zoo"
        shutil.copytree(
            REPO / "model_zoo" / "mnist",
            zoo / "mnist",
            ignore=shutil.ignore_patterns("__pycache__", "BUILD", "*_test.py"),
        )
        request = zoo_image.ZooImageRequest(
            base_image=args.image_base, model_zoo=str(zoo), prefix=env["ELASTICDL_NODE_REGISTRY"]
        )
        with contextlib.redirect_stderr(io.StringIO()):
            image = zoo_image.build_zoo_image(request).image
        manifest = tmp / "rbac.yaml"
        manifest.write_text(_cli("rbac", f"--namespace={namespace}"))
        subprocess.run(
            [_kubectl(), f"--kubeconfig={env['KUBECONFIG']}", "apply", "-f", str(manifest)],
            check=True,
            capture_output=True,
        )
        # Pods are refused until the token controller gave the default account its token.
        while not any(
            sa.secrets
            for sa in core.list_namespaced_service_account(
                namespace, field_selector="metadata.name=default"
            ).items
        ):
            time.sleep(0.1)

        pods = pod_start_seconds(core, namespace, args.pods)
        common = [
            "train",
            f"--model_def={MODEL_DEF}",
            "--num_epochs=1",
            "--minibatch_size=32",
            "--num_minibatches_per_task=2",
            "--num_ps_pods=1",
            f"--num_workers={args.workers}",
        ]
        api_host, api_port = env["ELASTICDL_NODE_API"].rsplit(":", 1)
        node_argv = common + [
            f"--image_name={image}",
            "--model_zoo=/model_zoo",
            "--training_data=/data/train",
            f"--namespace={namespace}",
            "--image_pull_policy=IfNotPresent",
            f"--volume=host_path={data},mount_path=/data",
            "--master_resource_request=cpu=0.2,memory=1024Mi",
            "--worker_resource_request=cpu=0.4,memory=1024Mi",
            "--ps_resource_request=cpu=0.2,memory=1024Mi",
            f"--envs=ELASTICDL_K8S_NETWORK=host,KUBERNETES_SERVICE_HOST={api_host},"
            f"KUBERNETES_SERVICE_PORT={api_port}",
        ]
        local_argv = common + [
            "--platform=local",
            f"--model_zoo={zoo}",
            f"--training_data={data / 'train'}",
        ]
        node_backend = get_backend("kubernetes", namespace)
        local_backend = get_backend("local")
        runs = {"node": [], "local": []}
        for i in range(args.repeats):
            for where, backend, argv in (
                ("local", local_backend, local_argv),
                ("node", node_backend, node_argv),
            ):
                first, total = run_job(backend, argv, f"bench-{where}-{i}")
                runs[where].append((first, total))
                print(
                    f"{where:5s} run {i}: submit -> first task trained {first:6.1f} s, "
                    f"submit -> Succeeded {total:6.1f} s",
                    flush=True,
                )
                if where == "node":
                    _cli("cancel", f"bench-{where}-{i}", f"--namespace={namespace}")
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
    finally:
        core.delete_namespace(namespace, grace_period_seconds=0)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
