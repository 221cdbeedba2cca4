"""cpu_per_minibatch.py runs end to end at a tiny size (so it cannot rot): the Keras loop and
real PS processes (1 and 2) in sync and async mode; its JSON line is sane. No timing
assertions."""
import os

from script_runs import json_line, run_script

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_per_minibatch.py")


def test_tiny_run_prints_a_sane_json_line(tmp_path):
    flags = ["--rows", "3000", "--features", "4", "--vocab", "50", "--minibatch_size", "64"]
    flags += ["--warmup", "2", "--minibatches", "5", "--modes", "sync,async", "--ps", "1,2"]
    out = run_script(
        SCRIPT,
        "--data",
        str(tmp_path / "ctr"),
        "--profile",
        str(tmp_path / "prof"),
        *flags,
        timeout=300,
        env={"HOME": str(tmp_path)},
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    summary = json_line(out)
    assert summary["benchmark"] == "cpu_per_minibatch" and summary["loop_cpu_ms"] > 0
    for key in ("sync", "async", "2ps_sync", "2ps_async"):
        assert summary[f"{key}_steps"] == 7, key  # warm-up and timed minibatches, all pushed
        assert summary[f"{key}_worker_cpu_ms"] > 0 and summary[f"{key}_ps_cpu_ms"] >= 0
        for who in ("worker", "ps"):
            assert (tmp_path / "prof" / f"{who}_{key}.prof").stat().st_size > 0


def test_bad_flags_are_one_line_errors():
    out = run_script(SCRIPT, "--modes", "sync,asnyc", timeout=60)
    assert out.returncode == 2
    assert "--modes must name some of sync,async once each" in out.stderr
    assert "Traceback" not in out.stderr
    out = run_script(SCRIPT, "--ps", "1,0", timeout=60)
    assert out.returncode == 2
    assert "--ps must be distinct PS counts >= 1" in out.stderr
    assert "Traceback" not in out.stderr
