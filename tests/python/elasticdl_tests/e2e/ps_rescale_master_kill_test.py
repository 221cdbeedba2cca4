"""A master killed in the middle of a PS count change: a local training job is scaled from 1
PS to 2 (``elasticdl scale-ps``) and its master SIGKILLed as soon as the change is journaled
(the old PS stopped, the new set being launched), before the change is done. The master
started again by the job's supervisor carries the change through from its journal: it runs
the new set (launching what the dead master did not, each new PS restoring the snapshot),
the workers move to it, and the job finishes with every record trained once and 2 PS."""

import os
import threading
import time
from pathlib import Path

from elasticdl_tests.waiting import wait_for

from .conftest import kill, replica
from .master_restart_test import _job_processes

JOB = "ps-change-master-kill"
RECORDS, TASK_RECORDS = 16384, 128
CHANGE_DONE = "PS count 1 -> 2 (PS set 1"


def _ps_set_journaled(job_dir: Path) -> bool:
    """The replica journal holds a PSSetChanged record (the change's point of no return)."""
    for path in (job_dir / "journal").glob("replicas-*"):
        try:
            if b'"ps_set"' in path.read_bytes():
                return True
        except OSError:  # compacted away meanwhile: the next poll reads its successor
            continue
    return False


def _training_files(fashion_mnist: Path, root: Path) -> Path:
    """16,384 records: enough to outlive the change and the restart on a loaded machine (with
    8,192 the workers had trained nearly all of them before the new master answered)."""
    names = sorted(n for n in os.listdir(fashion_mnist / "train") if not n.startswith("."))
    for name in names[:4]:
        (root / name).symlink_to(fashion_mnist / "train" / name)
    return root


def test_a_master_killed_after_the_ps_set_change_is_journaled_finishes_it(
    cli, fashion_mnist, tmp_path
):
    cli.submit(
        "train",
        JOB,
        f"--training_data={_training_files(fashion_mnist, tmp_path)}",
        "--num_epochs=1",
        "--minibatch_size=64",
        "--num_minibatches_per_task=2",
        "--num_workers=2",
        "--num_ps_pods=1",
    )
    job_dir = cli.job_dir(JOB).resolve()
    status = cli.wait_for(
        JOB,
        lambda s: s["records_trained"] >= 4 * TASK_RECORDS,
        timeout=180,
        what="trained 4 tasks",
    )
    master_pid = status["master"]["pid"]
    # The request is answered at once; the change runs on in the master. Asked on a thread so
    # the journal is watched from the moment the change starts.
    answers = []
    asking = threading.Thread(
        target=lambda: answers.append(
            cli.run("scale-ps", JOB, "--num_ps=2", "--platform=local", check=False)
        )
    )
    asking.start()
    wait_for(
        lambda: _ps_set_journaled(job_dir),
        120,
        "the PS set change (1 -> 2) in the replica journal",
        diagnose=lambda: cli.master_log(JOB)[-3000:],
        interval=0.01,
    )
    kill(master_pid)
    killed_log = cli.master_log(JOB)
    asking.join(120)
    assert answers and "-> 2" in answers[0].stderr, answers
    assert CHANGE_DONE not in killed_log, (
        "the change was done before the kill: " + killed_log[-2000:]
    )

    cli.wait_for(
        JOB,
        lambda s: s["master"].get("restarts", 0) == 1,
        timeout=180,
        what="the master started again after the kill",
    )
    final = cli.wait_end(JOB, timeout=300)
    log = cli.master_log(JOB)
    assert final["phase"] == "Succeeded", log[-4000:]
    assert final["records_trained"] == final["records_expected"] == RECORDS
    assert final["records_trained_per_epoch"] == {"1": RECORDS}
    assert final["tasks_done"] == RECORDS // TASK_RECORDS, final
    # The restarted master runs the new set: 2 PS, generation 1, both served the workers.
    assert final["ps_scaling"]["num_ps"] == 2 and final["ps_scaling"]["generation"] == 1, final
    assert "PS set 1 of 2 PS (journaled by a previous master)" in log, log[-4000:]
    for name in ("ps-0", "ps-1"):
        assert "restored version" in cli.replica_log(JOB, name), name
        assert replica(final, name)["restarts"] == 0, final["replicas"]
    # The workers the new master gave work to moved to the new set (on a loaded machine one may
    # reconnect only after the other took the rest of the job).
    logs = {name: cli.replica_log(JOB, name) for name in ("worker-0", "worker-1")}
    assert any("PS set 0 -> 1" in text for text in logs.values()), {
        name: text[-1500:] for name, text in logs.items()
    }
    # Never a second process of one replica, nothing left behind.
    deadline = time.monotonic() + 30
    while _job_processes(job_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _job_processes(job_dir)
