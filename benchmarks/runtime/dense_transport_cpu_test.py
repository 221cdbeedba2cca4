"""dense_transport_cpu.py runs end to end at a tiny size (so it cannot rot): real PS processes
on each transport, and each transport really taken; its JSON line is sane. No timing
assertions."""
import os

from script_runs import fashion_mnist_cache, json_line, run_script

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dense_transport_cpu.py")


def test_tiny_run_takes_each_transport_and_prints_a_sane_json_line():
    flags = ["--warmup", "2", "--minibatches", "4", "--repeats", "2"]
    out = run_script(SCRIPT, "--data", fashion_mnist_cache(), *flags, timeout=500)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    summary = json_line(out)
    assert summary["benchmark"] == "dense_transport_cpu" and summary["repeats"] == 2
    paths = {"shared_memory": "shared memory", "messages": "stream", "grpc": "grpc"}
    for transport, path in paths.items():
        assert summary[f"{transport}_path"] == path, transport
        assert summary[f"{transport}_steps"] == 6, transport  # warm-up and timed, all pushed
        assert summary[f"{transport}_wall_ms"] > 0 and summary[f"{transport}_ps_cpu_ms"] >= 0
        assert summary[f"{transport}_vs_shared_memory"] > 0
    assert summary["shared_memory_vs_shared_memory"] == 1.0


def test_bad_flags_are_one_line_errors():
    out = run_script(SCRIPT, "--transports", "messages,grcp", timeout=60)
    assert out.returncode == 2
    assert "--transports must name some of shared_memory,messages,grpc once each" in out.stderr
    assert "Traceback" not in out.stderr
