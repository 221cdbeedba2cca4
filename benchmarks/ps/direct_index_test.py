"""direct_index.py runs end to end at a tiny size (so it cannot rot) and its JSON line is sane.
Not a performance test: nothing here depends on how fast the machine is."""
import os

from script_runs import json_line, run_script

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "direct_index.py")


def test_a_tiny_run_prints_a_sane_json_line():
    out = run_script(
        SCRIPT, "--vocabulary", "2000", "--ids", "300", "--minibatches", "4", "--cold", "2",
        "--repeats", "2", timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json_line(out)
    assert summary["benchmark"] == "ps_direct_index"
    assert [(p["ids"], p["phase"]) for p in summary["points"]] == [
        (kind, phase) for kind in ("zipf", "uniform") for phase in ("cold", "warm")
    ]
    for p in summary["points"]:
        assert p["old_ms"] > 0 and p["new_ms"] > 0 and p["ratio"] > 0
        assert 0 < p["unique_ids"] <= 300


def test_bad_flags_are_one_line_errors():
    out = run_script(SCRIPT, "--cold", "50", "--minibatches", "40", timeout=60)
    assert out.returncode == 2
    assert "0 < --cold < --minibatches" in out.stderr
