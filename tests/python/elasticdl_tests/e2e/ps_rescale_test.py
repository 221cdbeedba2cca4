"""The PS count of a running job changes both ways: a local training job on Fashion-MNIST is
scaled from 1 PS to 2 (``elasticdl scale-ps``) a few tasks into training, then back to 1, and
finishes with every record trained once, the model carried over each change (the new PS
restore the snapshot's model version, the workers move to them in-process) and a sane
accuracy. The job is sized to outlive both changes on a loaded 2-core machine, where each
change (a PS process started, a snapshot restored) can take as long as an epoch of training;
it fails here if it ended first."""

from elasticdl_tests.waiting import wait_for

from .conftest import replica

JOB = "ps-rescale"
RECORDS, TEST_RECORDS, TASK_RECORDS = 16384, 4096, 128  # per epoch
EPOCHS = 4


def _changes(status: dict) -> list[dict]:
    return status.get("ps_scaling", {}).get("changes", [])


def _scale(cli, num_ps: int, generation: int) -> dict:
    answer = cli.run("scale-ps", JOB, f"--num_ps={num_ps}", "--platform=local")
    assert f"-> {num_ps}" in answer.stderr, answer.stderr
    status = cli.wait_for(
        JOB,
        lambda s: len(_changes(s)) == generation and _changes(s)[-1]["state"] in ("done", "failed"),
        timeout=120,
        what=f"changed to {num_ps} PS",
    )
    change = _changes(status)[-1]
    assert change["state"] == "done", change
    assert status["phase"] == "Running" and status["records_trained"] < EPOCHS * RECORDS, (
        "the job must outlive the change: make it longer",
        status["records_trained"],
    )
    return change


def test_a_running_job_scales_its_ps_up_and_down(cli, small_data):
    cli.submit(
        "train",
        JOB,
        f"--training_data={small_data['train']}",
        f"--validation_data={small_data['test']}",
        f"--num_epochs={EPOCHS}",
        "--minibatch_size=64",
        "--num_minibatches_per_task=2",
        "--num_workers=2",
        "--num_ps_pods=1",
    )
    cli.wait_for(
        JOB,
        lambda s: s["records_trained"] >= 8 * TASK_RECORDS,
        timeout=180,
        what="trained 8 tasks",
    )
    up = _scale(cli, 2, generation=1)
    assert (up["from_ps"], up["to_ps"]) == (1, 2) and up["version"] > 0, up
    # Both workers train on the first new set before the second change: a worker that got no
    # task in between would move from set 0 straight to set 2.
    wait_for(
        lambda: all(
            "PS set 0 -> 1" in cli.replica_log(JOB, name) for name in ("worker-0", "worker-1")
        ),
        120,
        "both workers to move to PS set 1",
    )
    down = _scale(cli, 1, generation=2)
    assert (down["from_ps"], down["to_ps"]) == (2, 1), down
    # Training went on between the changes: the model version grew from one to the next.
    assert down["version"] >= up["version"], (up, down)

    final = cli.wait_end(JOB, timeout=300)
    log = cli.master_log(JOB)
    assert final["phase"] == "Succeeded", log[-4000:]
    assert final["records_trained"] == final["records_expected"] == EPOCHS * RECORDS
    assert final["records_trained_per_epoch"] == {str(e): RECORDS for e in range(1, EPOCHS + 1)}
    rounds = len(final["evaluation_history"])
    train_tasks, eval_tasks = EPOCHS * RECORDS // TASK_RECORDS, TEST_RECORDS // TASK_RECORDS
    assert final["tasks_done"] == train_tasks + rounds * eval_tasks, final
    assert final["evaluation_metrics"]["accuracy"] >= 0.6, final["evaluation_metrics"]
    assert final["ps_scaling"]["num_ps"] == 1 and final["ps_scaling"]["generation"] == 2
    assert "PS count 1 -> 2 (PS set 1" in log and "PS count 2 -> 1 (PS set 2" in log, log[-4000:]
    # Each new PS started from the snapshot the change wrote, at its model version.
    assert f"restored version {up['version']}" in cli.replica_log(JOB, "ps-1")
    assert f"restored version {down['version']}" in cli.replica_log(JOB, "ps-0")
    # The workers moved in-process: none was relaunched, and each logged both moves.
    for name in ("worker-0", "worker-1"):
        assert replica(final, name)["replaced_by"] is None
        worker_log = cli.replica_log(JOB, name)
        assert "PS set 0 -> 1" in worker_log and "PS set 1 -> 2" in worker_log, worker_log[-2000:]
    shown = cli.run("status", JOB).stdout
    assert "PS scaling:" in shown and "1 -> 2 PS: done, training paused" in shown, shown
