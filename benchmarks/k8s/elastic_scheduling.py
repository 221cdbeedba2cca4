"""Elastic scheduling on the real two-node cluster: two competing jobs, gang admission against
ElasticDL as it is (``--experiment competing``, the default); or a low-priority job beside a
high-priority online service scaled up and down (``--experiment colocation``,
``colocation.py``); or that job's final accuracy with a fixed set of workers against under the
service's churn (``--experiment convergence``, ``convergence.py``).

    python benchmarks/k8s/elastic_scheduling.py [--size tiny|full] [--strategy ps|allreduce]
        [--experiment competing|colocation|convergence] [--repeats N]

Two identical jobs of the README model (Fashion-MNIST), each asking for more than half of the
cluster's allocatable CPU (requests equal to limits on every pod, so what the scheduler books
is what runs), the second submitted ``--delay`` seconds after the first, run twice:

* **gang**: a job is created only when all its pods fit at once in the free allocatable CPU
  (``gang.GangAdmission``: FIFO, an admitted job holds its whole request until its pods end);
* **elastic**: both are created when submitted; workers that do not fit wait Pending and the
  scheduler places them as CPU frees up.

Per job: pending time (submit -> its first worker Running), completion time (submit ->
Succeeded), records trained against records expected; per run: makespan (first submit ->
last job done) and the CPU utilisation timeline (``utilisation.Sampler``: requested from the
pods, used from the kubelets' cgroups), drawn to ``elastic_scheduling_<strategy>_<run>.png``
beside this file (``--png_dir``). Prints a line per job and run, then a JSON line.

The cluster is the one ``scripts/k8s/start-node.sh start`` runs; the benchmark needs it to
itself (its jobs fill it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import cluster
import colocation
import convergence
from gang import Elastic, GangAdmission, QueuedJob
from utilisation import Sampler, plot

TOOL = "elastic_scheduling"
POLL_S = 0.5
# Every pod asks for a quarter of a CPU (requests == limits): with 1 CPU per node a job of
# 5 pods asks for 1.25 of the cluster's 2 (more than half), and the quarters pack without
# fragments on either node.
POD_CPU = "0.25"
POD_MEMORY = "1024Mi"
SIZES = {
    # records, epochs, delay of the second job (s)
    "tiny": (1024, 1, 5.0),
    "full": (8192, 4, 30.0),
}
# Co-location: the training job's epochs (of the records above) and the service's schedule,
# (fraction of the job's records trained, replicas of 0.5 CPU).
COLOCATION = {
    "tiny": (100, ((0.15, 1), (0.3, 0))),
    "full": (20, ((0.12, 1), (0.3, 2), (0.5, 1), (0.7, 0))),
}


@dataclass
class JobResult:
    name: str
    submitted: float
    created: float | None = None
    first_worker_running: float | None = None
    done: float | None = None
    phase: str = ""
    records_trained: int = 0
    records_expected: int = 0

    @property
    def pending_s(self) -> float | None:
        if self.first_worker_running is None:
            return None
        return self.first_worker_running - self.submitted

    @property
    def completion_s(self) -> float | None:
        return None if self.done is None else self.done - self.submitted

    def row(self) -> dict:
        return {
            "job": self.name,
            "pending_s": _round(self.pending_s),
            "completion_s": _round(self.completion_s),
            "phase": self.phase,
            "records_trained": self.records_trained,
            "records_expected": self.records_expected,
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def job_argv(env, image: str, namespace: str, data: Path, name: str, args) -> list[str]:
    resources = f"cpu={POD_CPU},memory={POD_MEMORY}"
    if args.strategy == "ps":
        shape = ["--distribution_strategy=ParameterServerStrategy", "--num_ps_pods=1"]
        shape.append("--num_workers=3")
    else:
        shape = ["--distribution_strategy=AllreduceStrategy", "--num_workers=4"]
    argv = [
        "train",
        f"--model_def={cluster.MODEL_DEF}",
        "--training_data=/data/train",
        "--minibatch_size=64",
        "--num_minibatches_per_task=2",
        f"--num_epochs={args.epochs}",
        *shape,
        f"--job_name={name}",
        "--detach",
        *cluster.node_job_argv(env, image, namespace, f"host_path={data},mount_path=/data"),
    ]
    for replica in ("master", "ps", "worker"):
        argv += [
            f"--{replica}_resource_request={resources}",
            f"--{replica}_resource_limit={resources}",
        ]
    return argv


def job_cpu(args) -> float:
    pods = 1 + (1 + 3 if args.strategy == "ps" else 4)
    return pods * float(POD_CPU)


def _first_worker_running(core, namespace: str, job: str) -> bool:
    pods = core.list_namespaced_pod(namespace, label_selector=f"elasticdl-job-name={job}").items
    return any("-worker-" in p.metadata.name and p.status.phase == "Running" for p in pods)


def _master_phase(core, namespace: str, job: str) -> str:
    from kubernetes.client.rest import ApiException

    try:
        return core.read_namespaced_pod(f"elasticdl-{job}-master", namespace).status.phase
    except ApiException as e:
        if e.status == 404:
            return ""
        raise


def _pull_everywhere(env: dict[str, str], image: str) -> None:
    """Every engine holds the job's image before timing starts (a node pulling 2.5 GB while
    a job waits would be counted as that job's pending time)."""
    engines = [
        v.split(",", 1)[1] for k, v in env.items() if k.removeprefix("ELASTICDL_NODE_").isdigit()
    ]
    for engine in engines:
        r = subprocess.run(
            ["docker", "pull", "-q", image],
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "DOCKER_HOST": engine},
        )
        if r.returncode != 0:
            sys.exit(f"{TOOL}: docker pull {image} on {engine}: {r.stderr.strip()[-300:]}")


def one_run(mode: str, args, env, core, namespace: str, image: str, data: Path) -> dict:
    tag = uuid.uuid4().hex[:4]
    names = [f"{mode}-{tag}-a", f"{mode}-{tag}-b"]
    target = [f"--namespace={namespace}", "--platform=kubernetes"]

    def creator(name: str):
        return lambda: cluster.cli(TOOL, *job_argv(env, image, namespace, data, name, args))

    queue = [
        QueuedJob(name, job_cpu(args), i * args.delay, creator(name))
        for i, name in enumerate(names)
    ]
    admission = GangAdmission(core, namespace) if mode == "gang" else Elastic()
    sampler = Sampler(core).start()
    results = {j.name: JobResult(j.name, j.submit_at) for j in queue}
    finished: set[str] = set()
    deadline = time.monotonic() + args.timeout
    try:
        while len(finished) < len(queue):
            if time.monotonic() > deadline:
                sys.exit(f"{TOOL}: {mode} run not done after {args.timeout} s")
            now = time.monotonic() - sampler.t0
            admission.step(queue, now, finished)
            for job in queue:
                r = results[job.name]
                if job.created_at is None or job.name in finished:
                    continue
                r.created = job.created_at
                if r.first_worker_running is None and _first_worker_running(
                    core, namespace, job.name
                ):
                    r.first_worker_running = now
                phase = _master_phase(core, namespace, job.name)
                if phase in ("Succeeded", "Failed"):
                    r.done = now
                    finished.add(job.name)
                    status = json.loads(
                        cluster.cli(TOOL, "status", job.name, "-o", "json", *target)
                    )
                    r.phase = status["phase"]
                    r.records_trained = status["records_trained"]
                    r.records_expected = status["records_expected"]
            time.sleep(POLL_S)
        # The next run starts on an empty cluster.
        for name in names:
            cluster.cli(TOOL, "cancel", name, *target)
        while core.list_namespaced_pod(namespace).items and time.monotonic() < deadline:
            time.sleep(1)
    finally:
        sampler.stop()
    makespan = max(r.done for r in results.values())
    requested, used = sampler.mean(0, makespan)
    marks = {}
    for r in results.values():
        marks[f"{r.name[-1]} submit"] = r.submitted
        if r.first_worker_running is not None:
            marks[f"{r.name[-1]} 1st worker"] = r.first_worker_running
        marks[f"{r.name[-1]} done"] = r.done
    png = args.png_dir / f"{TOOL}_{args.strategy}_{mode}.png"
    plot(
        sampler,
        png,
        f"{mode}: two {args.strategy.upper()} jobs of {job_cpu(args):g} CPU on "
        f"{sampler.allocatable:g} CPUs (size {args.size}), makespan {makespan:.0f} s",
        marks,
    )
    out = {
        "mode": mode,
        "makespan_s": round(makespan, 1),
        "requested_util": round(requested, 3),
        "used_util": round(used, 3),
        "jobs": [r.row() for r in results.values()],
        "png": png.name,
    }
    for r in results.values():
        print(
            f"{mode}: job {r.name}: pending {r.pending_s:.1f} s, completion "
            f"{r.completion_s:.1f} s, {r.phase}, {r.records_trained}/{r.records_expected} records",
            flush=True,
        )
    print(
        f"{mode}: makespan {makespan:.1f} s, CPU requested {100 * requested:.0f}%, "
        f"used {100 * used:.0f}% of allocatable",
        flush=True,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--strategy", choices=("ps", "allreduce"), default="ps")
    parser.add_argument(
        "--experiment", choices=("competing", "colocation", "convergence"), default="competing"
    )
    parser.add_argument(
        "--repeats", type=int, default=2, help="convergence: jobs of each mode (fixed, churn)"
    )
    parser.add_argument(
        "--modes",
        default="gang,elastic",
        help="competing: the runs, comma-separated (gang, elastic); the ratio needs both",
    )
    parser.add_argument("--image_base", default="elasticdl:cpu")
    parser.add_argument("--png_dir", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--timeout", type=float, default=3600, help="per run, seconds")
    args = parser.parse_args()
    args.records, args.epochs, args.delay = SIZES[args.size]
    args.coloc_epochs, args.schedule = COLOCATION[args.size]
    if not args.png_dir.is_dir():
        parser.error(f"--png_dir {args.png_dir}: not a directory")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    args.modes = [m for m in args.modes.split(",") if m]
    if not args.modes or any(m not in ("gang", "elastic") for m in args.modes):
        parser.error(f"--modes: give gang, elastic or gang,elastic, got {','.join(args.modes)!r}")

    from elasticdl.data.datasets import prepare

    load = os.getloadavg()
    env = cluster.node_env(TOOL)
    work = Path(tempfile.mkdtemp(prefix="elasticdl-k8s-elastic-"))
    os.environ["ELASTICDL_HOME"] = str(work / "home")
    runs = []
    try:
        with cluster.namespace(TOOL, env) as (core, namespace):
            data = work / "data"
            prepare(
                "fashion_mnist",
                str(data),
                progress=False,
                limit=args.records,
                records_per_shard=256,
            )
            cluster.make_readable(data)
            image, _ = cluster.build_mnist_image(env, args.image_base, work)
            _pull_everywhere(env, image)
            if args.experiment == "colocation":
                runs.append(colocation.run(args, env, core, namespace, image, data))
            elif args.experiment == "convergence":
                runs.append(convergence.run(args, env, core, namespace, image, data))
            else:
                for mode in args.modes:
                    runs.append(one_run(mode, args, env, core, namespace, image, data))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.experiment in ("colocation", "convergence"):
        (run,) = runs
        print(
            json.dumps(
                {
                    "benchmark": "k8s_elastic_scheduling",
                    "experiment": args.experiment,
                    "size": args.size,
                    "records": args.records,
                    **run,
                    "loadavg": [round(load[0], 1), round(os.getloadavg()[0], 1)],
                }
            )
        )
        return
    by_mode = {r["mode"]: r for r in runs}
    result = {
        "benchmark": "k8s_elastic_scheduling",
        "experiment": "competing_jobs",
        "strategy": args.strategy,
        "size": args.size,
        "records": args.records,
        "epochs": args.epochs,
        "delay_s": args.delay,
        "job_cpu": job_cpu(args),
        "runs": runs,
        "makespan_ratio": (
            round(by_mode["elastic"]["makespan_s"] / by_mode["gang"]["makespan_s"], 3)
            if len(by_mode) == 2
            else None
        ),
        "loadavg": [round(load[0], 1), round(os.getloadavg()[0], 1)],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
