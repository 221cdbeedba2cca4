"""bench_autoscale.py runs end to end at a tiny size (so it cannot rot) and its JSON line is
sane. Not a performance test: nothing here depends on how fast the machine is."""
import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_autoscale.py")


def data_dir() -> str:
    default = Path.home() / ".cache" / "elasticdl" / "e2e" / "fashion_mnist"
    return os.environ.get("ELASTICDL_E2E_DATA") or str(default)


def test_tiny_run_prints_a_sane_json_line():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run(
        [
            sys.executable,
            SCRIPT,
            "--jobs=readme",
            "--fixed=1",
            "--max_workers=1",
            "--files=2",
            "--epochs=1",
            f"--readme_cache={data_dir()}",
        ],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["benchmark"] == "autoscale"
    readme = summary["jobs"]["readme"]
    assert set(readme["medians"]) == {"1", "auto"}
    for figures in readme["medians"].values():
        assert figures["records_per_s"] > 0 and figures["records_per_cpu_s"] > 0
    assert readme["best_fixed_by_efficiency"] == 1 and "goal_met" in readme


def test_bad_flags_are_one_line():
    out = subprocess.run(
        [sys.executable, SCRIPT, "--fixed=0,1"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "bench_autoscale: error: --fixed counts must be >= 1, got '0,1'"
    ]
