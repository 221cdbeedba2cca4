"""wire.py runs end to end at a tiny size (so it cannot rot) and its JSON line is sane.
Not a performance test: nothing here depends on how fast the machine is."""
import os

from script_runs import json_line, run_script

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wire.py")


def test_tiny_sizes_print_a_sane_json_line():
    out = run_script(SCRIPT, "--sizes", "1K,16K", "--repeats", "1", timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json_line(out)
    assert summary["benchmark"] == "ps_wire"
    points = summary["points"]
    assert [(p["payload_bytes"], p["case"]) for p in points] == [
        (size, case)
        for size in (1024, 16384)
        for case in (
            "pull",
            "push",
            "dense_shm",
            "dense_msg",
            "pull_grpc",
            "push_grpc",
            "dense_grpc",
        )
    ]
    for p in points:
        assert p["ps_ms"] > 0 and p["echo_ms"] > 0 and p["ratio"] > 0
        assert p["stream_ms"] > 0 and p["echo_over_stream"] > 0
    assert points[7]["rows"] == 16384 // (4 * 16)
    assert isinstance(summary["targets_met"], bool)


def test_bad_sizes_are_one_line_errors():
    out = run_script(SCRIPT, "--sizes", "1K,huge", timeout=60)
    assert out.returncode == 2
    assert "--sizes must be comma-separated sizes like 1K,64M" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_stream_baseline_answers_only_the_job_secret():
    import importlib.util
    import socket
    import threading

    spec = importlib.util.spec_from_file_location("wire_under_test", SCRIPT)
    wire = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wire)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    threading.Thread(target=wire.serve_stream, args=(listener, b"s3cret"), daemon=True).start()
    client = wire.StreamClient(port, b"s3cret")
    client.call(100, 5000)
    client.call(3, 0)
    client.close()
    stranger = wire.StreamClient(port, b"wrong!")
    stranger.sock.settimeout(10)
    try:
        stranger.call(100, 5000)
    except (ConnectionError, OSError):
        pass  # closed without an answer
    else:
        raise AssertionError("the stream answered a caller without the job secret")
    finally:
        stranger.close()
    listener.close()
