"""bench_autoscale.py runs end to end at a tiny size (so it cannot rot) and its JSON line is
sane. Not a performance test: nothing here depends on how fast the machine is."""
import os

from script_runs import fashion_mnist_cache, json_line, run_script

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_autoscale.py")


def test_tiny_run_prints_a_sane_json_line():
    out = run_script(
        SCRIPT,
        "--jobs=readme",
        "--fixed=1",
        "--max_workers=1",
        "--files=2",
        "--epochs=1",
        f"--readme_cache={fashion_mnist_cache()}",
        timeout=540,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json_line(out)
    assert summary["benchmark"] == "autoscale"
    readme = summary["jobs"]["readme"]
    assert set(readme["medians"]) == {"1", "auto"}
    for figures in readme["medians"].values():
        assert figures["records_per_s"] > 0 and figures["records_per_cpu_s"] > 0
    assert readme["best_fixed_by_efficiency"] == 1 and "goal_met" in readme


def test_bad_flags_are_one_line():
    out = run_script(SCRIPT, "--fixed=0,1", timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "bench_autoscale: error: --fixed counts must be >= 1, got '0,1'"
    ]
