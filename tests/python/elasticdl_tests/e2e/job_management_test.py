"""Managing a running local job through the CLI: status, logs, wait with a timeout, cancel."""
import json
import os

from .conftest import replica

JOB = "managed"


def test_status_logs_wait_and_cancel_a_running_job(cli, small_data):
    cli.submit(
        "train",
        JOB,
        f"--training_data={small_data['train']}",
        "--num_epochs=5",
        "--minibatch_size=64",
        "--num_workers=1",
        "--num_ps_pods=1",
    )
    running = cli.wait_for(
        JOB, lambda s: s["records_trained"] > 0, timeout=300, what="trained a task"
    )

    shown = json.loads(cli.run("status", JOB, "-o", "json").stdout)
    assert shown["job_name"] == JOB and shown["phase"] == "Running"
    assert (
        shown["epoch"] == 1 and shown["records_expected"] == 16384
    )  # epochs are created one by one
    assert cli.run("list").stdout.count(JOB) == 1

    assert "Launched worker-0" in cli.run("logs", JOB).stdout
    assert "PS 0 of 1 listening" in cli.run("logs", JOB, "--replica", "ps-0").stdout

    waited = cli.run("wait", JOB, "--timeout=1", timeout=60, check=False)
    assert waited.returncode != 0  # still running after 1 s

    cli.run("cancel", JOB, timeout=120)
    final = cli.status(JOB)
    assert final["phase"] == "Cancelled"
    assert cli.run("wait", JOB, "--timeout=30", timeout=60, check=False).returncode == 1
    # Nothing the job started is left running.
    pids = [running["master"]["pid"]] + [r["pid"] for r in running["replicas"] if r["pid"]]
    assert replica(running, "worker-0")["pid"] in pids
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        with open(f"/proc/{pid}/stat") as f:
            assert f.read().split()[2] == "Z", f"process {pid} of the cancelled job still runs"
