"""sparse_job.py runs end to end at a tiny size (so it cannot rot): real 1 PS + 1 worker jobs,
sync and async, and the Keras loop (with the batched feed) on a small synthetic_ctr; its JSON
line is sane. No timing
assertions."""
import os

from script_runs import json_line, run_script

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sparse_job.py")


def test_tiny_sparse_job_prints_a_sane_json_line(tmp_path):
    flags = ["--rows", "4000", "--features", "4", "--vocab", "50", "--ps", "1"]
    flags += ["--modes", "sync,async", "--loop_feed", "batched"]
    flags += ["--minibatch_size", "64", "--minibatches_per_task", "4", "--warmup_records", "512"]
    # HOME: nothing of this run lands in the real ~/.elasticdl or cache.
    out = run_script(
        SCRIPT,
        "--data",
        str(tmp_path / "ctr"),
        *flags,
        timeout=420,
        env={"HOME": str(tmp_path)},
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    summary = json_line(out)
    assert summary["benchmark"] == "sparse_job"
    assert summary["table_rows"] == 200 and summary["ps"] == [1]
    assert summary["modes"] == ["sync", "async"] and summary["loop_feed"] == "batched"
    assert 0.5 < summary["auc_ceiling"] < 1.0
    assert summary["baseline_samples_per_s"] > 0
    assert 0.0 < summary["baseline_auc"] < 1.0
    for job in ("1ps", "1ps_async"):
        assert summary[f"job_{job}_samples_per_s"] > 0, job
        assert summary[f"job_{job}_ratio"] > 0 and summary[f"job_{job}_paired_ratio"] > 0, job
        assert 0.0 < summary[f"job_{job}_auc"] < 1.0, job


def test_bad_flags_are_one_line_errors():
    out = run_script(SCRIPT, "--ps", "0", timeout=60)
    assert out.returncode == 2
    assert "--ps counts must be >= 1" in out.stderr
    assert "Traceback" not in out.stderr
    out = run_script(SCRIPT, "--modes", "sync,asnyc", timeout=60)
    assert out.returncode == 2
    assert "--modes must name some of sync,async once each" in out.stderr
    assert "Traceback" not in out.stderr
