"""initial_values.py runs end to end at a tiny size (so it cannot rot) and its JSON line is sane.
Not a performance test: nothing here depends on how fast the machine is."""
import os

from script_runs import json_line, run_script

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "initial_values.py")


def test_a_tiny_run_prints_a_sane_json_line():
    out = run_script(SCRIPT, "--rows", "3,40", "--dims", "1,5", "--repeats", "2", timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json_line(out)
    assert summary["benchmark"] == "ps_initial_values"
    assert summary["backend"] in ("native", "reference")
    assert [(p["rows"], p["dim"]) for p in summary["points"]] == [(3, 1), (3, 5), (40, 1), (40, 5)]
    for p in summary["points"]:
        assert p["reference_ms"] > 0 and p["native_ms"] > 0
    assert summary["team_threads"] >= 1 and summary["repeats"] == 2


def test_bad_flags_are_one_line_errors():
    out = run_script(SCRIPT, "--rows", "0,5", timeout=60)
    assert out.returncode == 2
    assert "--rows must be comma-separated positive integers" in out.stderr
    assert "Traceback" not in out.stderr
