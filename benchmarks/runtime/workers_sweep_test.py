"""workers_sweep.py runs end to end at a tiny size (so it cannot rot) and its JSON line is sane.
Not a performance test: nothing here depends on how fast the machine is."""
import os

from script_runs import json_line, run_script

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers_sweep.py")


def test_tiny_sweep_prints_a_sane_json_line():
    out = run_script(
        SCRIPT,
        *("--workers", "1,4", "--seconds", "0.5", "--paced_rate", "400"),
        *("--processes", "1", "--workers_per_process", "2"),
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json_line(out)
    assert summary["benchmark"] == "workers_sweep"
    assert summary["protocol"] == "lease" and summary["lease"] == 4  # the worker's default
    assert summary["max_workers"] == 4
    points = summary["points"]
    assert [(p["workers"], p["mode"]) for p in points] == [
        (1, "saturated"),
        (1, "paced"),
        (4, "saturated"),
        (4, "paced"),
    ]
    for p in points:
        assert p["tasks_per_s"] > 0
        assert 0 < p["get_p50_ms"] <= p["get_p99_ms"]
        assert 0 <= p["wait_p50_ms"] <= p["wait_p99_ms"]
        # A lease call per 4 tasks (a bit more: a worker's last lease of the window is cut).
        assert 0.2 <= p["calls_per_task"] <= 0.5
        assert p["master_rss_mib"] > 0 and p["master_cores"] > 0
    # At most 2 workers per client process: more processes for more workers.
    assert [p["client_processes"] for p in points] == [1, 1, 2, 2]
    # Paced workers train 4 / 400 s per task: at most 100 tasks/s each.
    assert points[3]["train_s_per_task"] == 0.01
    assert points[3]["tasks_per_s"] <= 4 * 100 * 1.1
    assert isinstance(summary["targets_met"], bool)


def test_the_one_call_per_task_protocol_still_runs():
    out = run_script(
        SCRIPT,
        "--workers",
        "2",
        "--seconds",
        "0.3",
        "--modes",
        "saturated",
        "--protocol",
        "combined",
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (point,) = json_line(out)["points"]
    assert point["calls_per_task"] == 1.0 and point["wait_p99_ms"] == point["get_p99_ms"]


def test_bad_flags_are_one_line_errors():
    out = run_script(SCRIPT, "--workers", "1,x", timeout=60)
    assert out.returncode == 2
    assert "--workers must be comma-separated integers" in out.stderr
    assert "Traceback" not in out.stderr
    out = run_script(SCRIPT, "--lease", "0", timeout=60)
    assert out.returncode == 2 and "--lease must be positive" in out.stderr
