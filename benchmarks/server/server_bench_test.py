"""server_bench.py runs end to end at a tiny size (so it cannot rot) and its JSON line is sane.
Not a performance test: nothing here depends on how fast the machine is."""

import os

from script_runs import json_line, run_script

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "server_bench.py")


def test_tiny_run_prints_a_sane_json_line():
    out = run_script(
        SCRIPT, "--jobs=2", "--requests=3", "--upload_mb=1", "--repeats=1", timeout=240
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json_line(out)
    assert summary["benchmark"] == "server" and summary["jobs"] == 2
    assert 0 < summary["list_ms"]["median"] <= summary["list_ms"]["p99"]
    assert summary["upload_mib_s"] > 0 and summary["cp_mib_s"] > 0
