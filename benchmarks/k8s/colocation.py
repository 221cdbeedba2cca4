"""Co-location with an online service: a low-priority training job fills the cluster while a
high-priority service (``online_service.py``) is scaled up and down on a schedule; the
scheduler preempts workers to place the service and the job takes the CPU back when the service
shrinks. With no schedule the service stays at zero replicas: the same job with a fixed set of
workers (Exp. 3's baseline). The job evaluates its final model on the test split (accuracy).

The job: master and PS (``elasticdl-high``, 0.25 CPU each) and 6 workers (``elasticdl-low``,
0.25 CPU each): 2 CPUs, the whole cluster. The service: replicas of 0.5 CPU (``elasticdl-high``),
each taking two workers' place. The schedule's steps are points of the job's progress (the
fraction of its records trained, from the master's status annotation), not seconds: on a machine
of any speed, and with any transport, the job then still has work left when the service shrinks,
to take the CPU back for. No step fires before all the job's workers have run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import cluster
import online_service
from elasticdl.jobs.k8s_status import master_status
from utilisation import Sampler, plot

TOOL = "elastic_scheduling"
WORKERS = 6
POD_CPU = "0.25"
SERVICE_CPU = "0.5"


def _kubectl(env, *args: str, stdin: str | None = None) -> str:
    r = subprocess.run(
        [cluster.kubectl(), f"--kubeconfig={env['KUBECONFIG']}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if r.returncode != 0:
        sys.exit(f"{TOOL}: kubectl {' '.join(args[:2])}: {r.stderr.strip()[-300:]}")
    return r.stdout


def install_priority_classes(env) -> list[str]:
    """ElasticDL's PriorityClasses (``elasticdl rbac --priority_classes``); those this call
    created, to remove afterwards."""
    existing = set(_kubectl(env, "get", "priorityclass", "-o", "name").split())
    _kubectl(env, "apply", "-f", "-", stdin=cluster.cli(TOOL, "rbac", "--priority_classes"))
    names = ("elasticdl-high", "elasticdl-low")
    return [n for n in names if f"priorityclass.scheduling.k8s.io/{n}" not in existing]


def progress(master, namespace: str) -> float:
    """The fraction of the job's records trained, as ``elasticdl status`` reads it from the
    master pod (the status the master publishes there every few seconds); 0 before the first."""
    if master is None:
        return 0.0
    status = master_status(master, namespace)
    total = status.records_total
    return status.records_trained / total if total > 0 else 0.0


def run(args, env, core, namespace: str, image: str, data: Path, schedule=None, png=None) -> dict:
    """One job; ``schedule`` (default ``args.schedule``): (fraction of the job's records
    trained, service replicas) steps; empty: the service is never scaled up."""
    schedule = list(args.schedule if schedule is None else schedule)
    fixed = not schedule
    job = f"{'fixed' if fixed else 'coloc'}-{uuid.uuid4().hex[:4]}"
    # This job's worker pods (the namespace keeps the pods' Events of earlier runs).
    ours = f"elasticdl-{job}-worker-"
    target = [f"--namespace={namespace}", "--platform=kubernetes"]
    created = install_priority_classes(env)
    token = online_service.new_token()
    secret, deployment = online_service.manifests(namespace, image, SERVICE_CPU, token)
    _kubectl(
        env,
        "apply",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [secret, deployment]}),
    )
    resources = f"cpu={POD_CPU},memory=1024Mi"
    argv = [
        "train",
        f"--model_def={cluster.MODEL_DEF}",
        "--training_data=/data/train",
        "--validation_data=/data/test",
        "--minibatch_size=64",
        "--num_minibatches_per_task=2",
        f"--num_epochs={args.coloc_epochs}",
        "--num_ps_pods=1",
        f"--num_workers={WORKERS}",
        "--worker_pod_priority=low",
        "--relaunch_on_worker_failure=0",
        f"--job_name={job}",
        "--detach",
        *cluster.node_job_argv(env, image, namespace, f"host_path={data},mount_path=/data"),
    ]
    for replica in ("master", "ps", "worker"):
        argv += [
            f"--{replica}_resource_request={resources}",
            f"--{replica}_resource_limit={resources}",
        ]
    sampler = Sampler(core).start()
    load = online_service.LoadGenerator(core, namespace, token).start()
    cluster.cli(TOOL, *argv)
    service_pods: dict[str, list] = {}  # name -> [first seen, Running at]
    workers_running: list[tuple[float, int]] = []
    steps = list(schedule)
    fired: list[tuple[float, int, float]] = []  # (progress, replicas, seconds) of each step
    t_schedule = None
    t_first_worker = None
    done = None
    deadline = time.monotonic() + args.timeout
    try:
        while done is None:
            if time.monotonic() > deadline:
                sys.exit(f"{TOOL}: co-location run not done after {args.timeout} s")
            now = time.monotonic() - sampler.t0
            pods = core.list_namespaced_pod(namespace).items
            running = sum(
                1
                for p in pods
                if p.metadata.name.startswith(ours)
                and p.status.phase == "Running"
                and not p.metadata.deletion_timestamp
            )
            workers_running.append((now, running))
            if t_first_worker is None and running:
                t_first_worker = now
            if t_schedule is None and running == WORKERS:
                t_schedule = now
            master = next((p for p in pods if p.metadata.name == f"elasticdl-{job}-master"), None)
            trained = progress(master, namespace)
            while t_schedule is not None and steps and trained >= steps[0][0]:
                _, replicas = steps.pop(0)
                fired.append((trained, replicas, now))
                _kubectl(
                    env,
                    "scale",
                    "deployment",
                    online_service.NAME,
                    f"--replicas={replicas}",
                    "-n",
                    namespace,
                )
            for p in pods:
                if p.metadata.labels and p.metadata.labels.get("app") == online_service.NAME:
                    seen = service_pods.setdefault(p.metadata.name, [now, None])
                    if seen[1] is None and p.status.phase == "Running":
                        seen[1] = now
            if master is not None and master.status.phase in ("Succeeded", "Failed"):
                done = now
            time.sleep(0.5)
        status = json.loads(cluster.cli(TOOL, "status", job, "-o", "json", *target))
        events = json.loads(
            _kubectl(
                env,
                "get",
                "events",
                "-n",
                namespace,
                "--field-selector=reason=Preempted",
                "-o",
                "json",
            )
        )["items"]
    finally:
        load.stop()
        sampler.stop()
        _kubectl(env, "scale", "deployment", online_service.NAME, "--replicas=0", "-n", namespace)
        cluster.cli(TOOL, "cancel", job, *target)
        if created:
            _kubectl(env, "delete", "priorityclass", *created, "--ignore-not-found")
    preempted = sorted(
        {
            e["involvedObject"]["name"]
            for e in events
            if e["involvedObject"]["name"].startswith(ours)
        }
    )
    last_scale = fired[-1][2] if fired and len(fired) == len(schedule) else None
    regained = None
    if not fixed:
        regained = last_scale is not None and any(
            t > last_scale and n == WORKERS for t, n in workers_running
        )
    # The running workers' count where it changed: what "regained" was read from.
    changes = [
        (round(t, 1), n)
        for i, (t, n) in enumerate(workers_running)
        if i == 0 or n != workers_running[i - 1][1]
    ]
    pending = [
        (ran - seen) if ran is not None else (done - seen) for seen, ran in service_pods.values()
    ]
    start = t_first_worker or 0.0
    requested, used = sampler.mean(start, done)
    png = args.png_dir / (png or f"{TOOL}_colocation.png")
    marks = {"job submit": 0.0, "job done": done}
    for share, replicas, t in fired:
        marks[f"service x{replicas} at {share:.0%}"] = t
    title = "fixed workers: the job alone" if fixed else "co-location: job + service"
    plot(sampler, png, f"{title} (2 CPUs, low workers; size {args.size})", marks)
    return {
        "mode": "fixed" if fixed else "colocation",
        "job": job,
        "phase": status["phase"],
        "records_trained": status["records_trained"],
        "records_expected": status["records_expected"],
        "accuracy": status.get("evaluation_metrics", {}).get("accuracy"),
        "requested_util": round(requested, 3),
        "used_util": round(used, 3),
        "window_s": [round(start, 1), round(done, 1)],
        "workers_preempted": len(preempted),
        "workers_regained": regained,
        "workers_running_changes": changes,
        "steps_fired": [[round(p, 3), r, round(t, 1)] for p, r, t in fired],
        "service_pods": len(service_pods),
        "service_pending_max_s": round(max(pending), 1) if pending else None,
        "requests": load.counts,
        "png": png.name,
    }
