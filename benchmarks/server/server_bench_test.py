"""server_bench.py runs end to end at a tiny size (so it cannot rot) and its JSON line is sane.
Not a performance test: nothing here depends on how fast the machine is."""

import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "server_bench.py")


def test_tiny_run_prints_a_sane_json_line():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run(
        [sys.executable, SCRIPT, "--jobs=2", "--requests=3", "--upload_mb=1", "--repeats=1"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["benchmark"] == "server" and summary["jobs"] == 2
    assert 0 < summary["list_ms"]["median"] <= summary["list_ms"]["p99"]
    assert summary["upload_mib_s"] > 0 and summary["cp_mib_s"] > 0
