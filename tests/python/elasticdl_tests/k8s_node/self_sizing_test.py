"""Jobs that size themselves and workers that fall behind, on the REAL cluster.

* **Stragglers.** A parameter-server job with two workers; once both train, one worker's
  container is held to 5% of a CPU through its own cgroup's CFS quota under the kubelet's pods
  hierarchy (what a pod's CPU limit sets; found from the container's host PID). The master
  must see it as slow (``status -o json`` "stragglers"), back up or withhold its tasks near the
  end, and still count every record exactly once; ``elasticdl status`` names it. The quota the
  container had is put back afterwards.
* **``--num_workers=auto`` beside the real scheduler.** The job's pods are placed on node 1,
  and a worker's CPU request is sized from that node's allocatable CPU so that two workers fit
  beside the master and the PS, a third never. The job starts at ``--min_workers=2`` (both
  run) and the master's first step from the minimum -- always tried, whatever the throughput
  and the load of the machine -- asks for a third, which the scheduler cannot place
  ("Insufficient cpu"): it waits Pending, ``elasticdl status`` shows why, and after
  ``--autoscale_pending_timeout`` the master counts it as not added (the decision's reason says
  Pending) and deletes it. The job Succeeds with every record trained exactly once, and
  ``elasticdl status`` lists the decisions. This test holds the cluster alone
  (``exclusive_cluster``, up to the module's end: the straggler test runs first, beside other
  files): another file's pods on node 1 would take a worker's room. (An added worker that runs
  is the local e2e test's and the real-cluster benchmark's, ``benchmarks/k8s/autoscale.py``:
  whether a second add follows depends on the measured gain.)
"""

from __future__ import annotations

import json
import re
import time
import uuid
from decimal import ROUND_DOWN, Decimal
from pathlib import Path

from elasticdl.client.main import main
from elasticdl.k8s.resources import parse_quantity
from elasticdl_testing.cpu_throttle import own_cgroup_quota

# The job's fixtures and argv: the same job as job_test.py's.
from elasticdl_tests.k8s_node.job_test import (  # noqa: F401  (fixtures, used by name)
    MINIBATCH,
    TRAIN_RECORDS,
    _job_argv,
    _rbac,
    cli_env,
    data_dir,
    mnist_image,
)
from elasticdl_tests.waiting import wait_for

MINIBATCHES_PER_TASK = 2
# The straggler job: enough tasks left once both workers are past their warm-up for the other
# worker to train on while the throttled one crawls.
STRAGGLER_EPOCHS = 12
THROTTLED_TO = 0.05  # of one CPU
# What the pod's CPU limit (_job_argv's 1 CPU) set as its container's quota, in 100 ms periods.
WORKER_LIMIT_QUOTA_US = 100_000
# Each worker logs its loss at its step 1 and every LOSS_STEPS steps: step 2 * LOSS_STEPS ends
# its fourth task, so its first task (the warm-up, which is not timed) has been reported.
LOSS_STEPS = 4
# The auto-sized job: it must still be training when the third worker is given up, which
# takes the warm-up, the baseline (two measuring windows that agree, 20 s or more) and the
# pending timeout: ~45 s of training, more if the baseline needs a third window. The epochs
# give two workers about twice that, so a faster build or machine still leaves a margin: a job
# that runs out of tasks first frees the CPU the third worker waits for.
AUTO_EPOCHS = 112
PENDING_TIMEOUT_S = 20
# _job_argv's CPU requests of the master and the PS.
MASTER_CPU = PS_CPU = Decimal("0.1")


def _target(ns: str) -> list[str]:
    return [f"--namespace={ns}", "--platform=kubernetes"]


def _status(job: str, ns: str, capsys) -> dict:
    capsys.readouterr()
    assert main(["status", job, "-o", "json", *_target(ns)]) == 0
    return json.loads(capsys.readouterr().out)


def _status_text(job: str, ns: str, capsys) -> str:
    capsys.readouterr()
    assert main(["status", job, *_target(ns)]) == 0
    return capsys.readouterr().out


def _master_log(job: str, ns: str, capsys) -> str:
    capsys.readouterr()
    assert main(["logs", job, *_target(ns)]) == 0
    return capsys.readouterr().out


def _diagnose(node, ns: str, job: str):
    def diagnose() -> str:
        return (
            node.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False)
            + node.kubectl("get", "events", "-n", ns, check=False)[-3000:]
            + "\n--- master ---\n"
            + node.kubectl("logs", "-n", ns, f"elasticdl-{job}-master", "--tail=60", check=False)
        )

    return diagnose


def _container_pid(node, pod) -> int:
    """The host PID of the pod's (only) container, from its node's engine."""
    cid = pod.status.container_statuses[0].container_id.split("://", 1)[1]
    return int(node.docker_on(pod.spec.node_name, "inspect", "-f", "{{.State.Pid}}", cid))


def _read(path: Path) -> str:
    return path.read_text().strip()


def _quota_now(quota_file: Path) -> int | None:
    """The cgroup's CFS quota; None once the cgroup is gone (its container ended)."""
    try:
        return int(_read(quota_file))
    except FileNotFoundError:
        return None


def test_a_worker_throttled_through_its_container_cgroup_is_a_straggler(
    cli_env,  # noqa: F811
    mnist_image,  # noqa: F811
    data_dir,  # noqa: F811
    node_namespace,
    node_k8s,
    monkeypatch,
    capsys,
):
    node, ns = cli_env, node_namespace
    image, ctx, _ = mnist_image
    _rbac(node, ns, capsys)
    monkeypatch.chdir(ctx)
    job = f"straggle-{uuid.uuid4().hex[:4]}"
    argv = [
        "train",
        *_job_argv(job, ns, image, data_dir),
        "--training_data=/data/train",
        f"--num_epochs={STRAGGLER_EPOCHS}",
        f"--num_minibatches_per_task={MINIBATCHES_PER_TASK}",
        "--num_ps_pods=1",
        "--num_workers=2",
        f"--log_loss_steps={LOSS_STEPS}",
    ]
    diagnose = _diagnose(node, ns, job)
    workers = [f"elasticdl-{job}-worker-{i}" for i in (0, 1)]
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
    t_submit = time.monotonic()

    def past_warm_up(name: str) -> bool:
        return f"steps = {2 * LOSS_STEPS}" in (node_k8s.read_pod_log(name) or "")

    def both_training():
        status = _status(job, ns, capsys)
        assert status["phase"] in ("Pending", "Running"), (
            f"the job ended ({status['phase']}) before both workers trained: raise "
            f"STRAGGLER_EPOCHS\n{diagnose()}"
        )
        pods = [node_k8s.get_pod(name) for name in workers]
        if all(p is not None and p.status.phase == "Running" for p in pods) and all(
            past_warm_up(name) for name in workers
        ):
            return pods[1]
        return None

    slow_pod = wait_for(both_training, 300, "both workers past their warm-up", diagnose)
    t_training = time.monotonic()
    pid = _container_pid(node, slow_pod)
    container_id = slow_pod.status.container_statuses[0].container_id.split("://", 1)[1]
    with own_cgroup_quota(pid, THROTTLED_TO) as cgroup:
        # The container's own cgroup under its kubelet's pods hierarchy, nothing made for it.
        assert cgroup.name == container_id and "kubepods" in cgroup.parts, cgroup
        quota_file = cgroup / "cpu.cfs_quota_us"
        assert _quota_now(quota_file) == int(THROTTLED_TO * WORKER_LIMIT_QUOTA_US), cgroup
        throttled_at = _status(job, ns, capsys)
        assert (
            throttled_at["phase"] == "Running"
        ), f"the job ended before the throttle: raise STRAGGLER_EPOCHS\n{throttled_at}"

        def seen_slow_or_ended():
            # Should the job end first, its final status says whether worker 1 was seen slow.
            status = _status(job, ns, capsys)
            slow = 1 in status["stragglers"].get("ever_slow", [])
            return status if slow or status["phase"] not in ("Pending", "Running") else None

        slow = wait_for(seen_slow_or_ended, 120, "the master to see worker 1 as slow", diagnose)
        assert main(["wait", job, "--timeout=600", *_target(ns)]) == 0, diagnose()
    # The container's quota is back (unless its cgroup is gone: the master removed the pod).
    after = _quota_now(quota_file)
    assert after in (None, WORKER_LIMIT_QUOTA_US), after
    job_s = time.monotonic() - t_submit

    final = _status(job, ns, capsys)
    total = TRAIN_RECORDS * STRAGGLER_EPOCHS
    assert final["phase"] == "Succeeded", final
    assert final["records_trained"] == final["records_expected"] == total, final
    # A dropped copy or a withheld task never cost a record: every task counted once.
    tasks = total // (MINIBATCHES_PER_TASK * MINIBATCH)
    assert final["tasks_done"] == tasks, final
    stragglers = final["stragglers"]
    assert 1 in stragglers["ever_slow"], stragglers
    # Near the end it got no more than its share, or its tasks were backed up (or both).
    assert stragglers["backups_issued"] + stragglers["tasks_withheld"] >= 1, stragglers
    log = _master_log(job, ns, capsys)
    assert re.search(r"Worker 1 is [\d.]+x slower than its peers", log), log[-3000:]
    assert f"trained {total}/{total} records" in log, log[-3000:]
    shown = _status_text(job, ns, capsys)
    # Worker 1 among the ever slow (on a loaded machine worker 0 may have been slow a while).
    assert "Stragglers:" in shown and re.search(r"ever slow: [^;]*\bworker-1\b", shown), shown
    with capsys.disabled():
        print(
            f"\nstraggler on the cluster: submit -> both past warm-up {t_training - t_submit:.0f}s "
            f"({throttled_at['records_trained']}/{total} records trained at the throttle); "
            f"seen slow at {slow['records_trained']} records; job {job_s:.0f}s; "
            f"backed up {stragglers['backups_issued']} (backup first "
            f"{stragglers['backups_won']}), withheld {stragglers['tasks_withheld']}"
        )
    assert main(["cancel", job, *_target(ns)]) == 0


def _worker_cpu(node) -> Decimal:
    """A worker's CPU request of which two fit on node 1 beside the master and the PS, and a
    third never: 45% of what is left of node 1's allocatable."""
    allocatable = json.loads(node.kubectl("get", "node", node.nodes[0], "-o", "json"))["status"][
        "allocatable"
    ]["cpu"]
    free = parse_quantity(str(allocatable)) - MASTER_CPU - PS_CPU
    cpu = (free * Decimal("0.45")).quantize(Decimal("0.001"), rounding=ROUND_DOWN)
    assert 2 * cpu <= free < 3 * cpu, (allocatable, cpu)
    return cpu


def _decisions(status: dict) -> list[dict]:
    return status.get("autoscaling", {}).get("decisions", [])


def test_an_auto_sized_job_counts_a_worker_the_scheduler_cannot_place_as_not_added(
    exclusive_cluster,
    cli_env,  # noqa: F811
    mnist_image,  # noqa: F811
    data_dir,  # noqa: F811
    node_namespace,
    node_k8s,
    monkeypatch,
    capsys,
):
    node, ns = exclusive_cluster, node_namespace
    image, ctx, _ = mnist_image
    _rbac(node, ns, capsys)
    monkeypatch.chdir(ctx)
    job = f"auto-{uuid.uuid4().hex[:4]}"
    cpu = _worker_cpu(node)
    worker_cpu = f"cpu={int(cpu * 1000)}m,memory=1024Mi"
    on_node1 = {"pod_spec": {"node_selector": {"kubernetes.io/hostname": node.nodes[0]}}}
    argv = [
        "train",
        *_job_argv(job, ns, image, data_dir),
        "--training_data=/data/train",
        f"--num_epochs={AUTO_EPOCHS}",
        f"--num_minibatches_per_task={MINIBATCHES_PER_TASK}",
        "--num_ps_pods=1",
        "--num_workers=auto",
        "--min_workers=2",
        "--max_workers=3",
        f"--autoscale_pending_timeout={PENDING_TIMEOUT_S}",
        # Requests equal to limits: what the scheduler books is what runs.
        f"--worker_resource_request={worker_cpu}",
        f"--worker_resource_limit={worker_cpu}",
        f"--cluster_spec_json={json.dumps(on_node1)}",
    ]
    diagnose = _diagnose(node, ns, job)
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
    t_submit = time.monotonic()
    pending_seen: dict = {}

    def decided(count: int):
        def check():
            status = _status(job, ns, capsys)
            for replica in status["replicas"]:
                if replica["phase"] == "Pending" and replica["waiting_message"]:
                    pending_seen[replica["name"]] = replica  # the latest reason
            if len(_decisions(status)) >= count:
                return status
            assert status["phase"] in ("Pending", "Running"), (
                f"the job ended ({status['phase']}) before decision {count}: raise AUTO_EPOCHS"
                f"\n{json.dumps(_decisions(status))}\n{diagnose()}"
            )
            return None

        return check

    first_status = wait_for(decided(1), 300, "the first decision", diagnose)
    second = _decisions(first_status)[0]
    # The first step from the minimum is always tried; both workers ran for its window.
    assert (second["action"], second["workers"], second["measured_workers"]) == (
        "add",
        3,
        2,
    ), second
    running = {r["name"] for r in first_status["replicas"] if r["phase"] == "Running"}
    assert {"worker-0", "worker-1"} <= running, first_status["replicas"]
    t_third = time.monotonic()
    third = f"worker-{second['worker']}"
    final_decision = _decisions(
        wait_for(decided(2), PENDING_TIMEOUT_S + 120, f"{third} to be given up", diagnose)
    )[1]
    given_up_s = time.monotonic() - t_third
    assert final_decision["action"] == "not_added", final_decision
    assert final_decision["worker"] == second["worker"] and final_decision["workers"] == 2
    assert final_decision["settled"] is True, final_decision
    assert (
        f"{third.replace('-', ' ')} was not running a task {PENDING_TIMEOUT_S} s after its launch "
        "(Pending: the cluster has no room for it)" in final_decision["reason"]
    ), final_decision
    # While it waited, the job status said why: the real scheduler's reason.
    waited = pending_seen.get(third)
    assert waited is not None, (pending_seen, diagnose())
    assert waited["waiting_reason"] == "Unschedulable", waited
    assert "Insufficient cpu" in waited["waiting_message"], waited
    for placed in ("worker-0", "worker-1"):
        assert (
            placed not in pending_seen
            or "Insufficient" not in pending_seen[placed]["waiting_message"]
        )
    # ... and it is gone: deleted by the master, not relaunched.
    wait_for(
        lambda: node_k8s.get_pod(f"elasticdl-{job}-{third}") is None,
        60,
        f"{third}'s pod to be deleted",
        diagnose,
    )

    checked, checked_s = _status(job, ns, capsys)["records_trained"], time.monotonic() - t_submit
    assert main(["wait", job, "--timeout=900", *_target(ns)]) == 0, diagnose()
    job_s = time.monotonic() - t_submit
    final = _status(job, ns, capsys)
    total = TRAIN_RECORDS * AUTO_EPOCHS
    assert final["phase"] == "Succeeded", final
    assert final["records_trained"] == final["records_expected"] == total, final
    assert final["autoscaling"]["settled"] and final["autoscaling"]["target"] == 2, final
    assert [(d["action"], d["workers"]) for d in _decisions(final)] == [
        ("add", 3),
        ("not_added", 2),
    ], _decisions(final)
    log = _master_log(job, ns, capsys)
    assert "Autoscaling: not_added -> 2 workers" in log, log[-3000:]
    assert f"trained {total}/{total} records" in log, log[-3000:]
    shown = _status_text(job, ns, capsys)
    assert "Autoscaling: 2..3 workers, target 2" in shown, shown
    assert "  add -> 3: " in shown, shown
    assert re.search(
        rf"  not_added -> 2: {third.replace('-', ' ')} was not running .*Pending", shown
    )
    with capsys.disabled():
        print(
            f"\nauto-sized job on the cluster: workers of {cpu} CPU on node 1; "
            f"{second['records_per_s']} records/s with 2 workers; "
            f"third worker given up {given_up_s:.0f}s after it was "
            f"added; checks done at {checked}/{total} records ({checked_s:.0f}s after submit); "
            f"job {job_s:.0f}s"
        )
    assert main(["cancel", job, *_target(ns)]) == 0
