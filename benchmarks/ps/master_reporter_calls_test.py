"""master_reporter_calls.py runs end to end at a tiny size (so it cannot rot) and prints a sane
JSON line. Not a performance test: nothing here depends on the machine's speed."""
import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "master_reporter_calls.py")


def test_tiny_run_prints_a_sane_json_line():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run(
        [sys.executable, SCRIPT, "--calls", "100", "--repeats", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["benchmark"] == "master_reporter_calls"
    cases = ["holding master", "unreachable master", "plain queue"]
    assert list(summary["median_s"]) == cases
    assert [len(summary["rounds_s"][c]) for c in cases] == [2, 2, 2]
    assert summary["ratio"]["case"] == "holding master" and summary["ratio"]["value"] > 0
    assert summary["calls_per_round"] == 100
