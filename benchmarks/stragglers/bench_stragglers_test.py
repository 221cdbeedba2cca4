"""bench_stragglers.py runs end to end at a tiny size (so it cannot rot) and its JSON line is
sane. Not a performance test: nothing here depends on how fast the machine is. The CPU limit
needs root: elsewhere the test skips with the benchmark's reason, except where
ELASTICDL_REQUIRE_CGROUP_CPU is set."""
import os

import pytest
from script_runs import fashion_mnist_cache, json_line, run_script

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_stragglers.py")
REQUIRE_ENV = "ELASTICDL_REQUIRE_CGROUP_CPU"


def test_tiny_run_prints_a_sane_json_line():
    out = run_script(
        SCRIPT,
        # 8,192 records, throttled after 256: the job trains for seconds after the master's
        # status (written every 2 s) shows the warm-up done, even on a loaded machine.
        "--files=2",
        "--warmup_records=256",
        "--repeats=1",
        f"--data={fashion_mnist_cache()}",
        timeout=540,
    )
    if out.returncode == 2 and "needs root" in out.stderr and not os.environ.get(REQUIRE_ENV):
        pytest.skip(out.stderr.strip())
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json_line(out)
    assert summary["benchmark"] == "stragglers"
    for mode in ("handled", "off"):
        assert summary["medians"][mode]["records"] == 8192
    assert summary["medians"]["off"]["backups_issued"] == 0


def test_bad_flags_are_one_line():
    out = run_script(SCRIPT, "--workers=1", timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "bench_stragglers: error: --files and --repeats must be >= 1, --workers >= 2 (one is "
        "throttled)"
    ]
