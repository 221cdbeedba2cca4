"""A local job whose owner (the client's supervisor) and master are SIGKILLed leaves no
process behind: its PS and workers notice the owner is gone and stop
(elasticdl.common.parent_watch). A master killed alone is started again by the owner
(master_restart_test.py)."""
import json
import os
import signal
import time

from .conftest import replica

JOB = "orphans"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_replicas_end_with_their_job_owner(cli, small_data):
    cli.submit(
        "train",
        JOB,
        f"--training_data={small_data['train']}",
        "--num_epochs=20",  # still training when the master is killed
        "--minibatch_size=64",
        "--num_workers=2",
        "--num_ps_pods=1",
    )
    status = cli.wait_for(
        JOB,
        lambda s: s["records_trained"] > 0
        and all(replica(s, n)["pid"] for n in ("ps-0", "worker-0", "worker-1")),
        timeout=300,
        what="training with all replicas up",
    )
    replicas = [replica(status, n)["pid"] for n in ("ps-0", "worker-0", "worker-1")]
    owner = json.loads((cli.job_dir(JOB) / "job.json").read_text())["pid"]
    os.killpg(owner, signal.SIGKILL)  # the owner's group: the owner and the master
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in replicas) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in replicas if _alive(p)], "replicas outlived their job's owner"
    final = cli.wait_end(JOB, timeout=60)
    shown = cli.run("status", JOB, "-o", "json", check=False).stdout
    assert '"phase": "Failed"' in shown, shown
    assert final["phase"] == "Running"  # the master never wrote a final phase: it was killed
