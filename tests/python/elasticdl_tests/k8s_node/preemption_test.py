"""A higher-priority pod takes a worker's place: real kube-scheduler preemption on the real
two-node cluster.

ElasticDL's PriorityClasses are installed (``elasticdl rbac --priority_classes | kubectl apply
-f -``), so a job's master and PS run as ``elasticdl-high`` and its workers as the preemptible
``elasticdl-low``. A parameter-server job whose two workers fill the cluster's CPU (requests
equal to limits) trains; then an ordinary high-priority pod (``sleep`` in the job's image,
``priorityClassName: elasticdl-high``) asks for more CPU than any node has free. With nothing
done by hand:

* the scheduler preempts a worker (its pod deleted, a ``Preempted`` Event on it);
* the master re-queues the worker's tasks at once and launches a worker in its place without
  using the relaunch budget (the job runs with ``--relaunch_on_worker_failure=0``: a failure
  that used the budget would not be relaunched at all);
* the new worker waits Pending, and ``elasticdl status`` says so with the scheduler's reason,
  while the high-priority pod runs and the other worker trains on;
* once the high-priority pod is deleted the new worker is scheduled and runs;
* the job Succeeds with every record trained exactly once.

The same for an AllReduce job (no PS): its group shrinks to the worker left and grows back
to two once the new worker runs (the master's rendezvous generations say so).

The module has the cluster to itself (``exclusive_cluster``): the job must fill the whole
cluster, and the PriorityClasses it installs would change the priorities of other files'
jobs; they are removed again at the end when this test installed them.
"""

from __future__ import annotations

import json
import re
import time
import uuid

import pytest
from elasticdl.client.main import main

# The job's fixtures and argv: the same job as job_test.py's.
from elasticdl_tests.k8s_node.job_test import (  # noqa: F401  (fixtures, used by name)
    TRAIN_RECORDS,
    _job_argv,
    _rbac,
    cli_env,
    data_dir,
    mnist_image,
    rendezvous_generations,
)
from elasticdl_tests.waiting import wait_for

# Work left for the relaunched worker after the high-priority pod is gone. An AllReduce job
# trains faster, and must still be training once the new worker has started and regrouped.
# On a quiet machine the test has seen all it checks at about a quarter of these (the job's
# progress is printed at the end); load slows the checks and the training alike.
EPOCHS = {"ParameterServerStrategy": 20, "AllreduceStrategy": 50}
# Each node offers 1 CPU. Master and PS (0.1 each; an AllReduce job has no PS) on node 1 and a
# worker on each node leave at most 0.3 and 0.4 CPU free: a 0.5 CPU pod fits nowhere without
# preempting a worker, and once it runs a worker's 0.6 fits nowhere either.
WORKER_CPU = "0.6"
HIGH_POD_CPU = "0.5"
CLASSES = ("elasticdl-high", "elasticdl-low")


def _install_priority_classes(node, capsys) -> list[str]:
    """``elasticdl rbac --priority_classes | kubectl apply -f -``; the classes that were not
    there before (to remove afterwards)."""
    existing = set(node.kubectl("get", "priorityclass", "-o", "name").split())
    capsys.readouterr()
    assert main(["rbac", "--priority_classes"]) == 0
    path = node.state_dir / f"priorityclasses-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(capsys.readouterr().out)
    try:
        node.kubectl("apply", "-f", str(path))
    finally:
        path.unlink()
    return [c for c in CLASSES if f"priorityclass.scheduling.k8s.io/{c}" not in existing]


def _high_priority_pod(ns: str, image: str, name: str) -> dict:
    """An ordinary pod above the job's workers: ``sleep`` in the job's image."""
    resources = {"cpu": HIGH_POD_CPU, "memory": "64Mi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "priorityClassName": "elasticdl-high",
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001},
            "containers": [
                {
                    "name": "sleep",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", "3600"],
                    "resources": {"requests": resources, "limits": resources},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def _events(node, ns: str, reason: str) -> list[dict]:
    return json.loads(
        node.kubectl("get", "events", "-n", ns, f"--field-selector=reason={reason}", "-o", "json")
    )["items"]


@pytest.mark.parametrize("strategy", ["ParameterServerStrategy", "AllreduceStrategy"])
def test_a_worker_preempted_by_the_scheduler_waits_pending_and_comes_back(
    strategy,
    exclusive_cluster,
    cli_env,  # noqa: F811
    mnist_image,  # noqa: F811
    data_dir,  # noqa: F811
    node_namespace,
    node_k8s,
    monkeypatch,
    capsys,
    tmp_path,
):
    node, ns = exclusive_cluster, node_namespace
    image, ctx, _ = mnist_image
    _rbac(node, ns, capsys)
    installed = _install_priority_classes(node, capsys)
    monkeypatch.chdir(ctx)
    allreduce = strategy == "AllreduceStrategy"
    job = f"preempt-{'ar' if allreduce else 'ps'}-{uuid.uuid4().hex[:4]}"
    target = [f"--namespace={ns}", "--platform=kubernetes"]
    on_node1 = {"node_selector": {"kubernetes.io/hostname": node.nodes[0]}}
    placement = (
        {"master_pod_spec": on_node1}
        if allreduce
        else {
            "master_pod_spec": on_node1,
            "ps_pod_spec": on_node1,
        }
    )
    argv = [
        "train",
        *_job_argv(job, ns, image, data_dir),
        "--training_data=/data/train",
        f"--num_epochs={EPOCHS[strategy]}",
        "--num_minibatches_per_task=2",
        *([] if allreduce else ["--num_ps_pods=1"]),
        "--num_workers=2",
        f"--distribution_strategy={strategy}",
        # Requests equal to limits: what the scheduler sees is what runs.
        f"--worker_resource_request=cpu={WORKER_CPU},memory=1024Mi",
        f"--worker_resource_limit=cpu={WORKER_CPU},memory=1024Mi",
        "--worker_pod_priority=low",
        "--relaunch_on_worker_failure=0",
        f"--cluster_spec_json={json.dumps(placement)}",
    ]
    high = f"high-{uuid.uuid4().hex[:4]}"

    def diagnose() -> str:
        return (
            node.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False)
            + node.kubectl("get", "events", "-n", ns, check=False)[-3000:]
            + "\n--- master ---\n"
            + node.kubectl("logs", "-n", ns, f"elasticdl-{job}-master", "--tail=60", check=False)
        )

    def master_log() -> str:
        return node_k8s.read_pod_log(f"elasticdl-{job}-master") or ""

    def status() -> dict:
        capsys.readouterr()
        assert main(["status", job, "-o", "json", *target]) == 0
        return json.loads(capsys.readouterr().out)

    try:
        capsys.readouterr()
        assert main(argv) == 0, capsys.readouterr().err[-3000:]
        t_submit = time.monotonic()
        roles = (
            ("master", "worker-0", "worker-1")
            if allreduce
            else ("master", "ps-0", "worker-0", "worker-1")
        )
        pods = {f"elasticdl-{job}-{r}" for r in roles}
        classes = {}

        def training():
            s = status()
            listed = {p.metadata.name: p for p in node_k8s.list_pods()}
            running = {n for n, p in listed.items() if p.status.phase == "Running"}
            if pods <= running and s["records_trained"] > 0:
                classes.update({n: listed[n].spec.priority_class_name for n in pods})
                return s
            return None

        wait_for(training, 300, "both workers to run and the job to train", diagnose)
        assert classes[f"elasticdl-{job}-master"] == "elasticdl-high", classes
        assert allreduce or classes[f"elasticdl-{job}-ps-0"] == "elasticdl-high", classes
        assert classes[f"elasticdl-{job}-worker-0"] == "elasticdl-low", classes
        assert classes[f"elasticdl-{job}-worker-1"] == "elasticdl-low", classes

        path = tmp_path / "high.json"
        path.write_text(json.dumps(_high_priority_pod(ns, image, high)))
        node.kubectl("create", "-f", str(path))
        t_high = time.monotonic()

        def preempted() -> dict | None:
            events = [
                e
                for e in _events(node, ns, "Preempted")
                if e["involvedObject"]["name"].startswith(f"elasticdl-{job}-worker-")
            ]
            return events[0] if events else None

        event = wait_for(preempted, 120, "the scheduler to preempt a worker", diagnose)
        victim = event["involvedObject"]["name"].replace(f"elasticdl-{job}-", "")
        assert high in event["message"], event  # "Preempted by <ns>/<high pod> on node ..."

        def replacement_pending() -> tuple[dict, str] | None:
            s = status()
            replicas = {r["name"]: r for r in s["replicas"]}
            gone = replicas.get(victim, {})
            if gone.get("replaced_by") is None:
                return None
            new = replicas.get(f"worker-{gone['replaced_by']}", {})
            if new.get("phase") != "Pending" or not new.get("waiting_message"):
                return None
            high_pod = node_k8s.get_pod(high)
            if high_pod is None or high_pod.status.phase != "Running":
                return None
            return s, f"worker-{gone['replaced_by']}"

        s, new = wait_for(
            replacement_pending, 120, "the replacement to wait Pending with a reason", diagnose
        )
        replicas = {r["name"]: r for r in s["replicas"]}
        gone = replicas[victim]
        # Ended by the scheduler, relaunched without using the (zero) relaunch budget.
        assert gone["ended_by"] == "preempted", gone
        assert replicas[new]["restarts"] == 0, replicas[new]
        assert replicas[new]["waiting_reason"] == "Unschedulable", replicas[new]
        assert "Insufficient cpu" in replicas[new]["waiting_message"], replicas[new]
        # What a user reads: the new worker pending for the scheduler's reason, the other
        # worker still running, and the preemption counted.
        capsys.readouterr()
        assert main(["status", job, *target]) == 0
        text = capsys.readouterr().out
        assert "Workers:     1 running, 1 pending" in text, text
        assert re.search(rf"pending {new}: Unschedulable: .*Insufficient cpu", text), text
        assert "1 preempted (relaunched without using the relaunch budget)" in text, text
        pending_s = time.monotonic() - t_high

        def trained_on_while_pending() -> int:
            later = status()
            new_now = {r["name"]: r for r in later["replicas"]}[new]
            assert new_now["phase"] == "Pending", (new_now, diagnose())
            return later["records_trained"] > s["records_trained"] and later["records_trained"]

        # A Pending worker never blocks training: the other worker trains on meanwhile.
        trained_while_pending = wait_for(
            trained_on_while_pending, 60, "training to go on beside the Pending worker", diagnose
        )

        victim_id, new_id = int(victim.split("-")[1]), int(new.split("-")[1])
        if allreduce:
            # The group went on without the preempted worker: the one left trains alone.
            survivor = ({0, 1} - {victim_id}).pop()
            shrunk = rendezvous_generations(master_log())
            assert (1, [survivor]) in shrunk, shrunk
        node.kubectl("delete", "pod", "-n", ns, high, "--grace-period=0", "--force")
        t_freed = time.monotonic()

        def new_running() -> dict | None:
            r = {x["name"]: x for x in status()["replicas"]}.get(new, {})
            return r if r.get("phase") == "Running" else None

        wait_for(new_running, 180, f"{new} to be scheduled and run", diagnose)
        back_s = time.monotonic() - t_freed
        final = status()
        assert (
            final["phase"] == "Running"
        ), f"the job ended before {new} came back: raise EPOCHS\n{final}"
        if allreduce:

            def regrown() -> bool:
                groups = [(size, sorted(ids)) for size, ids in rendezvous_generations(master_log())]
                if (2, sorted([survivor, new_id])) in groups:
                    return True
                phase = status()["phase"]
                assert (
                    phase == "Running"
                ), f"the job ended ({phase}) before its group regrew: raise EPOCHS"
                return False

            # ... and grows back to two with the new worker.
            wait_for(regrown, 300, f"worker {survivor} and {new} in one group", diagnose)
        checked, t_checked = status()["records_trained"], time.monotonic()
        assert main(["wait", job, "--timeout=900", *target]) == 0, diagnose()
        final = status()
        total = TRAIN_RECORDS * EPOCHS[strategy]
        assert final["phase"] == "Succeeded", final
        assert final["records_trained"] == final["records_expected"] == total, final
        capsys.readouterr()
        assert main(["logs", job, *target]) == 0
        log = capsys.readouterr().out
        assert re.search(
            rf"Worker {victim_id}: relaunch \(preempted; does not use the relaunch budget\) "
            rf"as {new.replace('-', ' ')}",
            log,
        ), log[-3000:]
        assert f"trained {total}/{total} records" in log, log[-3000:]
        with capsys.disabled():
            print(
                f"\npreemption ({strategy}): submit -> training {t_high - t_submit:.0f}s; high pod -> "
                f"{victim} preempted and {new} Pending {pending_s:.1f}s "
                f"({trained_while_pending} records trained by then); high pod deleted -> "
                f"{new} Running {back_s:.1f}s; checks done at {checked}/{total} records "
                f"({t_checked - t_submit:.0f}s after submit, the job {time.monotonic() - t_submit:.0f}s), "
                f"{final['tasks_recovered']} task(s) recovered"
            )
        assert main(["cancel", job, *target]) == 0
    finally:
        node.kubectl("delete", "pod", "-n", ns, high, "--ignore-not-found", check=False)
        if installed:
            node.kubectl("delete", "priorityclass", *installed, "--ignore-not-found", check=False)
