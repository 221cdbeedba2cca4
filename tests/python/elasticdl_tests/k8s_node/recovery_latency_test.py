"""benchmarks/k8s/recovery_latency.py's measurement at a tiny size on the REAL node,
so it cannot rot: a restartable job's workers are killed twice with ``docker kill`` of their
container, and each kill is followed in the master's journal on the hostPath volume and through
the API server. Asserts what happened (the victim's tasks re-queued, a new worker in its place,
Running, then training), never how fast; the job is then cancelled and leaves nothing.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import uuid

from elasticdl.client.main import main
from elasticdl_tests.k8s_node import job_test
from elasticdl_tests.k8s_node.job_test import _checkpoint_dir, _rbac, _train_argv
from elasticdl_tests.k8s_node.node import repo_root
from elasticdl_tests.waiting import wait_for
from kubernetes import client


def _recovery_module():
    """benchmarks/k8s/recovery.py, loaded from its file: the benchmarks are scripts, not a
    package (a top-level ``k8s`` would be ambiguous)."""
    path = repo_root() / "benchmarks" / "k8s" / "recovery.py"
    spec = importlib.util.spec_from_file_location("k8s_bench_recovery", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


recovery = _recovery_module()

# job_test's fixtures, used here by name.
cli_env = job_test.cli_env
data_dir = job_test.data_dir
mnist_image = job_test.mnist_image

logger = logging.getLogger(__name__)
KILLS = 2


def test_killed_workers_recovery_is_measured_from_the_journal(
    cli_env, mnist_image, data_dir, node_namespace, node_k8s, monkeypatch, capsys, tmp_path
):
    node = cli_env
    image, ctx, _ = mnist_image
    ns = node_namespace
    _rbac(node, ns, capsys)
    monkeypatch.chdir(ctx)
    volume = _checkpoint_dir(tmp_path)  # the master's job dir, written by the restricted pods
    job = f"recov-{uuid.uuid4().hex[:4]}"
    # Long enough that the second kill finds the job training even when a replacement takes
    # minutes to start on a loaded machine (it is cancelled after the kills).
    argv = _train_argv(job, ns, image, data_dir, 200, volume)
    flags = ["--job_dir=/checkpoints/job", f"--relaunch_on_worker_failure={KILLS}"]
    assert main([*argv, *flags]) == 0
    core = client.CoreV1Api(node.api_client())
    journal = recovery.JournalTail(volume / "job" / "journal")
    try:
        kills = recovery.measure_kills(core, ns, job, journal, KILLS, "docker", node.docker_any)
    finally:
        assert main(["cancel", job, f"--namespace={ns}", "--platform=kubernetes"]) == 0
    for kill in kills:
        logger.info("%s", kill)
        assert kill.requeued_tasks, kill  # the victim held a task (chosen so) and got it back
        assert 0 < kill.requeued_s <= kill.trained_s and kill.running_s <= kill.trained_s, kill
    victims = [k.victim for k in kills]
    replacements = [k.replacement for k in kills]
    # Workers 0 and 1 (in the order they took tasks: on two nodes either may be first), each
    # replaced by a new id (2, 3), never one reused.
    assert sorted(victims) == [0, 1] and replacements == [2, 3], kills
    wait_for(
        lambda: node_k8s.list_pods(f"elasticdl-job-name={job}") == [],
        120,
        "the cancelled job's pods to go",
    )
