"""master_reporter_calls.py runs end to end at a tiny size (so it cannot rot) and prints a sane
JSON line. Not a performance test: nothing here depends on the machine's speed."""
import os

from script_runs import json_line, run_script

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "master_reporter_calls.py")


def test_tiny_run_prints_a_sane_json_line():
    done = run_script(SCRIPT, "--calls", "100", "--repeats", "2", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json_line(done)
    assert summary["benchmark"] == "master_reporter_calls"
    cases = ["holding master", "unreachable master", "plain queue"]
    assert list(summary["median_s"]) == cases
    assert [len(summary["rounds_s"][c]) for c in cases] == [2, 2, 2]
    assert summary["ratio"]["case"] == "holding master" and summary["ratio"]["value"] > 0
    assert summary["calls_per_round"] == 100
