"""benchmarks/k8s/elastic_scheduling.py at its tiny size on the REAL cluster, so the
experiments cannot rot: two competing parameter-server jobs, each asking for more than half of
the cluster's CPU, under ElasticDL as it is; and a low-priority job co-located with a
high-priority online service.

Asserts what happened, never how fast: every job Succeeds with every record trained exactly
once; the second job starts beside the first (its first worker runs before the first job is
done) instead of waiting for it; the run drew its utilisation timeline. The co-location job runs
under the service's churn and evaluates its final model.

The benchmark's gang-admission baseline (the same pair, the second job admitted only whole) is
not run here: it is the benchmark's stand-in for other schedulers, not ElasticDL, and it took
half of this file's time (benchmarks/k8s/README.md runs it beside the elastic run).
"""

from __future__ import annotations

import json

from elasticdl_tests.k8s_node.node import repo_root
from script_runs import json_line, run_script

SCRIPT_TIMEOUT_S = 1200


def test_competing_jobs_the_second_starts_beside_the_first(
    exclusive_cluster, base_image, tmp_path, monkeypatch
):
    base, _ = base_image
    # The benchmark joins the cluster this module holds alone instead of waiting for it.
    monkeypatch.setenv("ELASTICDL_NODE_HELD_BY_CALLER", "1")
    monkeypatch.setenv("KUBECONFIG", exclusive_cluster.kubeconfig)
    out = run_script(
        str(repo_root() / "benchmarks" / "k8s" / "elastic_scheduling.py"),
        "--size=tiny",
        "--modes=elastic",
        f"--image_base={base}",
        f"--png_dir={tmp_path}",
        timeout=SCRIPT_TIMEOUT_S,
    )
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
    result = json_line(out)
    (run,) = result["runs"]
    assert run["mode"] == "elastic" and result["makespan_ratio"] is None, result
    for job in run["jobs"]:
        assert job["phase"] == "Succeeded", json.dumps(run)
        assert job["records_trained"] == job["records_expected"] > 0, json.dumps(run)
    assert (tmp_path / run["png"]).stat().st_size > 0
    assert 0 < run["requested_util"] <= 1, run
    first, second = run["jobs"]
    first_done = first["completion_s"]  # the first job is submitted at 0
    second_started = result["delay_s"] + second["pending_s"]
    assert second_started < first_done, run


def test_colocation_beside_a_high_priority_service(
    exclusive_cluster, base_image, tmp_path, monkeypatch
):
    """The co-location experiment at its tiny size (Exp. 2): a low-priority job fills the
    cluster, a high-priority service (bearer token required) is scaled to one replica and back
    to zero; the scheduler preempts workers for it, the job takes them back and Succeeds with
    every record once, and its final model learned (far above the 10% of chance on ten
    classes); the service answered its load generator and refused a request without the
    token. Exp. 3 (``--experiment convergence``) is this run beside the same job with fixed
    workers (``convergence.py``, a loop over ``colocation.run``): its figures are the full
    size's, and CI runs the churned job once, here."""
    base, _ = base_image
    monkeypatch.setenv("ELASTICDL_NODE_HELD_BY_CALLER", "1")
    monkeypatch.setenv("KUBECONFIG", exclusive_cluster.kubeconfig)
    classes_before = exclusive_cluster.kubectl("get", "priorityclass", "-o", "name")
    out = run_script(
        str(repo_root() / "benchmarks" / "k8s" / "elastic_scheduling.py"),
        "--experiment=colocation",
        "--size=tiny",
        f"--image_base={base}",
        f"--png_dir={tmp_path}",
        timeout=SCRIPT_TIMEOUT_S,
    )
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
    result = json_line(out)
    # The whole result in every message (pytest shortens a dict's repr).
    shown = json.dumps(result, sort_keys=True)
    assert result["experiment"] == "colocation" and result["mode"] == "colocation", shown
    assert result["phase"] == "Succeeded", shown
    assert result["records_trained"] == result["records_expected"] > 0, shown
    assert result["accuracy"] is not None and 0.5 < result["accuracy"] <= 1, shown
    assert (tmp_path / result["png"]).stat().st_size > 0, shown
    assert result["workers_preempted"] >= 1, shown
    assert result["workers_regained"] is True, shown
    assert result["service_pods"] >= 1, shown
    assert result["requests"].get("200", 0) > 0, shown
    # Refused without the token, never answered; a request to a pod still starting or already
    # stopping gets no answer at all ("error"), which says nothing either way.
    unauthenticated = {
        k[len("unauthenticated_") :]: n
        for k, n in result["requests"].items()
        if k.startswith("unauthenticated_")
    }
    assert unauthenticated.get("401", 0) > 0, shown
    assert set(unauthenticated) <= {"401", "error"}, shown
    # The PriorityClasses the benchmark installed are gone again.
    assert exclusive_cluster.kubectl("get", "priorityclass", "-o", "name") == classes_before
