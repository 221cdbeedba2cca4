"""`--num_workers=auto` against fixed worker counts on the real cluster: throughput and
throughput per CPU used, measured from the pods' cgroups.

    python benchmarks/k8s/autoscale.py [--jobs readme,sparse] [--fixed 1,2,3,4] [--max_workers 4]
        [--records 16384] [--sparse_rows 100000] [--epochs 3] [--repeats 1] [--worker_cpu 0.3]

Jobs, 1 PS each, ``--epochs``:

* ``readme``: ``mnist.mnist_functional_api.custom_model`` on the first ``--records``
  Fashion-MNIST training records, minibatch 64, 2 minibatches a task.
* ``sparse``: ``deepfm.deepfm_ctr.custom_model`` on synthetic_ctr (``--sparse_rows`` rows, 26
  features x 38,462 ids: the local benchmark's sparse job), minibatch 256, 16 minibatches a task.

Each on the cluster ``scripts/k8s/start-node.sh start`` runs (started if needed, never stopped),
with ``--num_workers=N`` for every N of ``--fixed`` and with ``--num_workers=auto --min_workers=1
--max_workers=<--max_workers>``, in interleaved rounds, ``--repeats`` of them. Pods: master and
PS 0.2 CPU, workers ``--worker_cpu`` (limits equal to the requests, so each pod is held to its
share); the benchmark refuses to start when the largest job would not fit the nodes' free CPU,
since workers left Pending would measure the scheduler, not the sizing.

Per job, from the first record trained to the last (the master's published status, polled
every ``POLL_S``): records/s, the **CPUs used** over the same span -- the CPU time of every
container of the job's pods (master, PS, workers), read from its cgroup v1 ``cpuacct.usage``
under the kubelet's ``kubepods`` hierarchy on this machine, sampled at each poll; a container
that ends inside the span counts up to its last sample -- and records per CPU second, with
auto's decisions. After each job a JSON line breaks its span down: each pod's CPU seconds in
the span and when it was first and last seen, and auto's decisions on the same clock (where an
auto job's extra CPU went). Prints a table and one JSON line (load average before and after).
Exits with a one-line error when a job does not Succeed with every record trained once.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import cluster
import utilisation

sys.path.insert(0, str(cluster.REPO / "benchmarks"))
sys.path.insert(0, str(cluster.REPO / "benchmarks" / "autoscale"))
from autoscale_figures import (  # noqa: E402
    GOAL,
    Mark,
    UsageError,
    parse_counts,
    span_figures,
    summarise,
)
from interleaved import load_average  # noqa: E402

TOOL = "k8s_autoscale"
POLL_S = 0.5
MASTER_CPU = PS_CPU = 0.2  # cluster.node_job_argv's requests
JOBS = ("readme", "sparse")
SPARSE_FEATURES, SPARSE_VOCAB, SPARSE_ZIPF = 26, 38_462, 1.1
# The kubelet's cgroupfs layout: Guaranteed pods directly under kubepods, the others under
# their QoS class's cgroup.
QOS_CGROUP = {"Guaranteed": "", "Burstable": "burstable", "BestEffort": "besteffort"}


def pod_cgroup(kubepods: Path, qos_class: str, uid: str) -> Path:
    """The pod's cgroup under one kubelet's ``kubepods`` cgroup (cgroupfs driver)."""
    if qos_class not in QOS_CGROUP:
        raise ValueError(f"unknown QoS class {qos_class!r}")
    return kubepods / QOS_CGROUP[qos_class] / f"pod{uid}"


def container_usage_ns(pod_dir: Path) -> dict[str, int]:
    """Each container cgroup of the pod (its subdirectories: the sandbox and the job's
    container) -> its ``cpuacct.usage`` in nanoseconds; {} when the pod has no cgroup here
    (another kubelet's pod, or one already gone)."""
    usage = {}
    try:
        children = [c for c in pod_dir.iterdir() if c.is_dir()]
    except OSError:
        return usage
    for child in children:
        try:
            usage[str(child)] = int((child / "cpuacct.usage").read_text())
        except (OSError, ValueError):
            pass  # removed between the listing and the read: its last sample stands
    return usage


class CpuMeter:
    """The CPU seconds of a set of containers, each at its newest sample: a container seen
    once keeps counting what it had used when last seen, so one that ends between two samples
    is not lost (its cgroup is removed with it)."""

    def __init__(self) -> None:
        self.latest: dict[str, int] = {}
        self.owner: dict[str, str] = {}  # container cgroup -> the pod it belongs to

    def sample(self, usage_ns: dict[str, int], pod: str = "") -> None:
        for path, ns in usage_ns.items():
            self.latest[path] = max(self.latest.get(path, 0), ns)
            self.owner.setdefault(path, pod)

    def seconds(self) -> float:
        return sum(self.latest.values()) / 1e9

    def by_pod(self) -> dict[str, float]:
        """CPU seconds of each pod's containers (sandbox included), at their newest samples."""
        out: dict[str, float] = {}
        for path, ns in self.latest.items():
            out[self.owner[path]] = out.get(self.owner[path], 0.0) + ns / 1e9
        return out


def pod_breakdown(
    start: Mark, start_cpu: dict, end: Mark, end_cpu: dict, seen: dict, decisions: list, t0: float
) -> dict:
    """Where a job's CPU went inside its span: each pod's CPU seconds between the span's ends
    and the seconds (from the span's start) it was first and last seen, and the autoscaling
    decisions' times on the same scale (``t0``: the wall clock at the span's start)."""
    pods = {}
    for pod in sorted(set(start_cpu) | set(end_cpu)):
        first, last = seen[pod]
        pods[pod] = {
            "cpu_s": round(end_cpu.get(pod, 0.0) - start_cpu.get(pod, 0.0), 2),
            "seen_s": [round(first - start.t, 1), round(last - start.t, 1)],
        }
    return {
        "span_s": round(end.t - start.t, 1),
        "pods": pods,
        "decisions": [
            {
                "t_s": round(d["time"] - t0, 1),
                "action": d["action"],
                "worker": d.get("worker"),
                "records_per_s": d.get("records_per_s"),
                "gain": d.get("gain"),
                "required_gain": d.get("required_gain"),
                "ps": d.get("ps", {}),
            }
            for d in decisions
        ],
    }


def fits(free: list[float], pods: list[float]) -> bool:
    """Whether ``pods`` (CPU requests, in the order the job creates them: master, PS, workers)
    fit nodes with ``free`` CPU when each goes to the first node with room. That packing can
    strand the last worker where the scheduler's spreading might not; the check errs that way
    because a worker left Pending would measure the scheduler instead of the sizing."""
    room = list(free)
    for cpu in pods:
        node = next((i for i, r in enumerate(room) if r + 1e-9 >= cpu), None)
        if node is None:
            return False
        room[node] -= cpu
    return True


def free_cpu(core) -> list[float]:
    """Each node's allocatable CPU less the requests of the pods placed on it that have not
    ended (other users' jobs included)."""
    free = {
        n.metadata.name: utilisation.cpu(n.status.allocatable["cpu"])
        for n in core.list_node().items
    }
    for pod in core.list_pod_for_all_namespaces().items:
        if pod.spec.node_name in free and pod.status.phase not in ("Succeeded", "Failed"):
            free[pod.spec.node_name] -= utilisation.pod_cpu_request(pod)
    return list(free.values())


def model_flags(kind: str, args) -> list[str]:
    """The flags of the ``kind`` job's model and data (its data at /data/<kind> in the pods)."""
    if kind == "readme":
        return [
            f"--model_def={cluster.MODEL_DEF}",
            "--training_data=/data/readme/train",
            "--minibatch_size=64",
            "--num_minibatches_per_task=2",
        ]
    if kind == "sparse":
        return [
            "--model_def=deepfm.deepfm_ctr.custom_model",
            f"--model_params=features={SPARSE_FEATURES}; vocab={SPARSE_VOCAB}",
            "--training_data=/data/sparse/train",
            "--minibatch_size=256",
            "--num_minibatches_per_task=16",
        ]
    raise ValueError(f"unknown job {kind!r}")


def job_argv(args, node_argv: list[str], workers: str, kind: str = "readme") -> list[str]:
    sizing = [f"--num_workers={workers}"]
    if workers == "auto":
        sizing += ["--min_workers=1", f"--max_workers={args.max_workers}"]
    pods = [
        f"--worker_resource_request=cpu={args.worker_cpu:g},memory=1024Mi"
        if a.startswith("--worker_resource_request=")
        else a
        for a in node_argv
    ]
    return [
        "train",
        *model_flags(kind, args),
        f"--num_epochs={args.epochs}",
        "--num_ps_pods=1",
        *sizing,
        *pods,
    ]


def run_job(args, core, backend, namespace: str, kubepods: list[Path], argv, name, workers):
    from elasticdl.k8s.names import job_selector

    cluster.cli(TOOL, *argv, f"--job_name={name}", "--detach")
    deadline = time.monotonic() + args.timeout
    meter, start, end = CpuMeter(), None, None
    seen: dict[str, list[float]] = {}  # pod -> [first, last] poll that saw it
    while True:
        status = backend.status(name)
        now = time.monotonic()
        for pod in core.list_namespaced_pod(namespace, label_selector=job_selector(name)).items:
            if pod.status.qos_class:
                seen.setdefault(pod.metadata.name, [now, now])[1] = now
                for root in kubepods:
                    meter.sample(
                        container_usage_ns(
                            pod_cgroup(root, pod.status.qos_class, pod.metadata.uid)
                        ),
                        pod.metadata.name,
                    )
        now = time.monotonic()
        if start is None and status.records_trained > 0:
            start = Mark(now, status.records_trained, meter.seconds())
            start_cpu, start_wall = meter.by_pod(), time.time()
        done = status.epoch >= args.epochs and status.records_trained >= status.records_expected > 0
        if start is not None and end is None and done:
            end = Mark(now, status.records_trained, meter.seconds())
            end_cpu = meter.by_pod()
        if status.is_final:
            break
        if now > deadline:
            sys.exit(f"{TOOL}: job {name} did not end in {args.timeout:g} s (--timeout)")
        time.sleep(POLL_S)
    if status.phase != "Succeeded" or status.records_trained != status.records_expected:
        sys.exit(
            f"{TOOL}: job {name} {status.phase} with {status.records_trained} of "
            f"{status.records_expected} records trained: {status.message}"
        )
    if start is None or end is None:
        sys.exit(f"{TOOL}: job {name} ended before two polls saw it train: use more --records")
    try:
        figures = span_figures(name, start, end, status.autoscaling or {}, workers)
        decisions = (status.autoscaling or {}).get("decisions", [])
        figures["breakdown"] = pod_breakdown(
            start, start_cpu, end, end_cpu, seen, decisions, start_wall
        )
        return figures
    except RuntimeError as e:
        sys.exit(f"{TOOL}: {e}")
    finally:
        cluster.cli(TOOL, "cancel", name, f"--namespace={namespace}")


TITLES = {"readme": "README job", "sparse": "Sparse job (DeepFM)"}


def rounds(repeats: int, jobs: list[str], counts: list[str]):
    """(repeat, job, workers) in the order they run: every count of every job per repeat."""
    return [(r, kind, w) for r in range(repeats) for kind in jobs for w in counts]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="readme,sparse")
    parser.add_argument("--fixed", default="1,2,3,4")
    parser.add_argument("--max_workers", type=int, default=4)
    parser.add_argument("--records", type=int, default=16384)
    parser.add_argument("--sparse_rows", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--worker_cpu", type=float, default=0.3)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--image_base", default="elasticdl:cpu")
    args = parser.parse_args(argv)
    try:
        args.jobs = [j for j in args.jobs.split(",") if j]
        if not args.jobs or set(args.jobs) - set(JOBS):
            raise UsageError(f"--jobs must name readme and/or sparse, got {','.join(args.jobs)!r}")
        args.fixed = parse_counts(args.fixed)
        if min(args.max_workers, args.records, args.sparse_rows, args.epochs, args.repeats) < 1:
            raise UsageError(
                "--max_workers, --records, --sparse_rows, --epochs and --repeats must be >= 1"
            )
        if not 0 < args.worker_cpu <= 64:
            raise UsageError(f"--worker_cpu must be a CPU share like 0.3, got {args.worker_cpu:g}")
    except UsageError as e:
        parser.exit(2, f"{TOOL}: error: {e}\n")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    from elasticdl.data.datasets import prepare
    from elasticdl.jobs.platforms import platform_backend

    load_before = load_average()
    env = cluster.node_env(TOOL)
    tmp = Path(tempfile.mkdtemp(prefix="elasticdl-k8s-autoscale-"))
    os.environ["ELASTICDL_HOME"] = str(tmp / "home")
    counts = [str(n) for n in args.fixed] + ["auto"]
    runs = {kind: {w: [] for w in counts} for kind in args.jobs}
    try:
        with cluster.namespace(TOOL, env) as (core, namespace):
            largest = max(*args.fixed, args.max_workers)
            free = free_cpu(core)
            if not fits(free, [MASTER_CPU, PS_CPU] + [args.worker_cpu] * largest):
                sys.exit(
                    f"{TOOL}: error: a master and a PS of {MASTER_CPU:g} CPU and {largest} workers "
                    f"of --worker_cpu {args.worker_cpu:g} do not fit the nodes' free CPU "
                    f"{[round(f, 2) for f in free]}: lower --worker_cpu or the worker counts"
                )
            data = tmp / "data"
            if "readme" in args.jobs:
                prepare("fashion_mnist", str(data / "readme"), progress=False, limit=args.records)
            if "sparse" in args.jobs:
                params = dict(
                    rows=args.sparse_rows,
                    features=SPARSE_FEATURES,
                    vocab=SPARSE_VOCAB,
                    zipf=SPARSE_ZIPF,
                    seed=0,
                )
                prepare("synthetic_ctr", str(data / "sparse"), progress=False, params=params)
            cluster.make_readable(tmp)
            models = ("mnist",) * ("readme" in args.jobs) + ("deepfm",) * ("sparse" in args.jobs)
            image, _ = cluster.build_zoo_image(env, args.image_base, tmp, models)
            node_argv = cluster.node_job_argv(
                env, image, namespace, f"host_path={data},mount_path=/data"
            )
            backend = platform_backend("kubernetes", namespace)
            kubepods = utilisation.kubepods_cgroups(len(free))
            # interleaved: load drifts hit every count alike
            for r, kind, workers in rounds(args.repeats, args.jobs, counts):
                name = f"as-{kind}-{workers}-{r}"
                argv = job_argv(args, node_argv, workers, kind)
                run = run_job(args, core, backend, namespace, kubepods, argv, name, workers)
                runs[kind][workers].append(run)
                print(
                    f"{name}: {run['records_per_s']:.1f} records/s, {run['cpus_used']:.3f} CPUs, "
                    f"{run['records_per_cpu_s']:.1f} records per CPU s "
                    f"{' '.join(run['decisions'])}",
                    flush=True,
                )
                print(json.dumps({"job": name, **run["breakdown"]}), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {"benchmark": "k8s_autoscale", "goal": GOAL}
    for kind in args.jobs:
        summary[kind] = summarise(
            f"{TITLES[kind]} on the cluster: --num_workers=N vs auto (1..{args.max_workers}), "
            f"workers {args.worker_cpu:g} CPU",
            runs[kind],
            args.fixed,
        )
    summary.update(
        fixed=args.fixed,
        max_workers=args.max_workers,
        worker_cpu=args.worker_cpu,
        jobs=args.jobs,
        records=args.records,
        sparse_rows=args.sparse_rows,
        epochs=args.epochs,
        repeats=args.repeats,
        load_before=load_before,
        load_after=load_average(),
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
