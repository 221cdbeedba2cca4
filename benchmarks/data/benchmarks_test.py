"""recordio_scan.py and prepare_noop.py run end to end at a tiny size (so they cannot rot) and
print a sane JSON line. Not performance tests: nothing here depends on the machine's speed."""
import os

from script_runs import json_line, run_script

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(script: str, *args: str) -> dict:
    done = run_script(os.path.join(HERE, script), *args, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json_line(done)


def _assert_interleaved(summary: dict, cases: list[str], repeats: int) -> None:
    assert list(summary["median_s"]) == cases
    assert [len(summary["rounds_s"][c]) for c in cases] == [repeats] * len(cases)
    assert all(s > 0 for c in cases for s in summary["rounds_s"][c])
    assert summary["ratio"]["value"] > 0
    assert len(summary["load_average_before"]) == len(summary["load_average_after"]) == 3


def test_recordio_scan_at_a_tiny_size():
    summary = _run("recordio_scan.py", "--records", "3000", "--repeats", "2")
    assert summary["benchmark"] == "recordio_scan" and summary["records"] == 3000
    _assert_interleaved(summary, ["scan", "in-memory loop"], 2)
    assert summary["ratio"]["case"] == "scan" and summary["file_bytes"] > 0


def test_prepare_noop_at_a_tiny_size():
    summary = _run("prepare_noop.py", "--limit", "64", "--repeats", "2")
    assert summary["benchmark"] == "prepare_noop"
    assert summary["records"] == {"train": 64, "test": 64}
    _assert_interleaved(summary, ["no-op prepare", "hash inputs"], 2)
