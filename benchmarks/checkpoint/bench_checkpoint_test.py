"""bench_checkpoint.py runs end to end at a tiny size (so it cannot rot) and its JSON line is
sane. Not a performance test: nothing here depends on how fast the machine is."""
import os

from script_runs import json_line, run_script

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_checkpoint.py")


def test_tiny_run_prints_a_sane_json_line(tmp_path):
    out = run_script(
        SCRIPT, "--rows", "2e3,2e4", "--repeats", "1", "--dir", str(tmp_path), timeout=240
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json_line(out)
    assert summary["benchmark"] == "ps_checkpoint_blocking"
    assert summary["rows"] == [2000, 20000]
    for per_rows in summary["per_rows"].values():
        for mode in ("sync", "copy", "cow"):
            assert per_rows[mode]["blocked_s"] > 0
    assert os.listdir(tmp_path) == []  # its checkpoints went with its temporary directory


def test_bad_rows_are_one_line():
    out = run_script(SCRIPT, "--rows", "many", timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "bench_checkpoint: error: --rows must be comma-separated numbers like 1e5,1e6, got 'many'"
    ]
