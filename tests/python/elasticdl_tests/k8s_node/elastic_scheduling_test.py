"""benchmarks/k8s/elastic_scheduling.py at its tiny size on the REAL cluster, so the
experiments cannot rot: two competing parameter-server jobs, each asking for more than half of
the cluster's CPU, under gang admission and under ElasticDL as it is.

Asserts what happened, never how fast: every job Succeeds with every record trained exactly
once; under gang admission the second job waits until the first has finished (its first worker
runs only after the first job is done), while elastically it starts beside the first (its first
worker runs before the first job is done); both runs drew their utilisation timeline.
"""

from __future__ import annotations

import json

from elasticdl_tests.k8s_node.node import repo_root
from script_runs import json_line, run_script

SCRIPT_TIMEOUT_S = 1200


def test_competing_jobs_gang_against_elastic(exclusive_cluster, base_image, tmp_path, monkeypatch):
    base, _ = base_image
    # The benchmark joins the cluster this module holds alone instead of waiting for it.
    monkeypatch.setenv("ELASTICDL_NODE_HELD_BY_CALLER", "1")
    monkeypatch.setenv("KUBECONFIG", exclusive_cluster.kubeconfig)
    out = run_script(
        str(repo_root() / "benchmarks" / "k8s" / "elastic_scheduling.py"),
        "--size=tiny",
        f"--image_base={base}",
        f"--png_dir={tmp_path}",
        timeout=SCRIPT_TIMEOUT_S,
    )
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
    result = json_line(out)
    runs = {r["mode"]: r for r in result["runs"]}
    assert set(runs) == {"gang", "elastic"}, result
    for run in runs.values():
        for job in run["jobs"]:
            assert job["phase"] == "Succeeded", json.dumps(run)
            assert job["records_trained"] == job["records_expected"] > 0, json.dumps(run)
        assert (tmp_path / run["png"]).stat().st_size > 0
        assert 0 < run["requested_util"] <= 1, run
    delay = result["delay_s"]
    for mode, run in runs.items():
        first, second = run["jobs"]
        first_done = first["completion_s"]  # the first job is submitted at 0
        second_started = delay + second["pending_s"]
        if mode == "gang":
            assert second_started > first_done, (mode, run)
        else:
            assert second_started < first_done, (mode, run)
