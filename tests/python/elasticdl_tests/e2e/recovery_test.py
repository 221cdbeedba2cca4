"""Failures during a real job, then jobs that start from what it left behind.

One training job (4 Fashion-MNIST files = 16,384 records, 1 PS + 2 workers, default checkpoint
flags, --output) is run once for this module; while it trains, the test SIGKILLs worker 0,
then, once the PS wrote its version-100 recovery checkpoint, SIGKILLs the PS. The tests then
check what each failure must (not) cost, and run evaluation and prediction jobs from the
checkpoint and load the exported SavedModel.
"""
import os
import time

import numpy as np
import pytest
from elasticdl.ps.checkpoint import is_valid_version_dir

from .conftest import kill, replica

JOB = "recovery"
TRAIN_FLAGS = (
    "--num_epochs=1",
    "--minibatch_size=64",
    "--num_minibatches_per_task=2",
    "--num_workers=2",
    "--num_ps_pods=1",
)


@pytest.fixture(scope="module")
def recovery_job(cli, small_data, tmp_path_factory):
    saved_model = tmp_path_factory.mktemp("export") / "saved_model"
    cli.submit(
        "train",
        JOB,
        f"--training_data={small_data['train']}",
        f"--output={saved_model}",
        *TRAIN_FLAGS,
    )
    ckpt_root = cli.job_dir(JOB) / "recovery-checkpoints"

    # 1. A worker dies mid-task: SIGKILL, like a preempted pod.
    status = cli.wait_for(
        JOB,
        lambda s: s["records_trained"] >= 1280 and replica(s, "worker-0")["pid"],
        timeout=300,
        what="trained 1280 records",
    )
    worker_pid = replica(status, "worker-0")["pid"]
    kill(worker_pid)

    # 2. The PS dies once it has a checkpoint to come back from.
    deadline = time.monotonic() + 300
    # Shard files are renamed into place when complete: kill as soon as version-100 is whole
    # (training is fast; waiting longer risks killing the PS after the last push).
    while not is_valid_version_dir(str(ckpt_root / "version-100")):
        assert time.monotonic() < deadline, f"no checkpoint version-100 in {ckpt_root}"
        assert cli.status(JOB)["phase"] == "Running", cli.master_log(JOB)[-3000:]
        time.sleep(0.05)
    ps_pid = replica(cli.status(JOB), "ps-0")["pid"]
    kill(ps_pid)
    killed_at_records = cli.status(JOB)["records_trained"]

    final = cli.wait_end(JOB, timeout=600)
    return {
        "status": final,
        "saved_model": saved_model,
        "ckpt_root": ckpt_root,
        "worker_pid": worker_pid,
        "ps_pid": ps_pid,
        "killed_at_records": killed_at_records,
    }


def test_job_survives_both_kills(cli, recovery_job):
    status = recovery_job["status"]
    assert status["phase"] == "Succeeded", cli.master_log(JOB)[-4000:]
    assert (
        recovery_job["killed_at_records"] < status["records_expected"]
    ), "the PS was killed after training"


def test_killed_worker_loses_no_task_and_is_relaunched(cli, recovery_job):
    status = recovery_job["status"]
    # Exactly-once accounting: every record of the epoch trained, none twice.
    assert status["records_trained"] == status["records_expected"] == 16384
    assert status["records_trained_per_epoch"] == {"1": 16384}
    dead = replica(status, "worker-0")
    assert dead["phase"] == "Failed" and dead["replaced_by"] is not None, dead
    replacement = replica(status, f"worker-{dead['replaced_by']}")
    assert replacement["phase"] == "Succeeded", replacement
    assert "Relaunch" in cli.master_log(JOB) or "relaunch" in cli.master_log(JOB)


def test_killed_ps_is_relaunched_from_its_last_checkpoint(cli, recovery_job):
    ps = replica(recovery_job["status"], "ps-0")
    assert ps["restarts"] == 1, ps
    log = cli.replica_log(JOB, "ps-0")
    restored = [line for line in log.splitlines() if "restored version" in line]
    assert restored, log[-3000:]
    assert "version-" in restored[-1] and str(recovery_job["ckpt_root"]) in restored[-1], restored[
        -1
    ]
    restored_version = int(restored[-1].split("restored version ")[1].split()[0])
    assert restored_version >= 100 and restored_version % 100 == 0
    # Training went on from the restored version to the end of the epoch.
    assert recovery_job["status"]["model_version"] > restored_version


def _latest_checkpoint(root):
    versions = sorted(
        int(p.name.split("-")[1]) for p in root.iterdir() if p.name.startswith("version-")
    )
    assert versions, f"no checkpoints in {root}"
    return root / f"version-{versions[-1]}"


def test_evaluate_and_predict_from_the_checkpoint(cli, recovery_job, small_data):
    ckpt = _latest_checkpoint(recovery_job["ckpt_root"])
    cli.submit(
        "evaluate",
        "recovery-eval",
        f"--validation_data={small_data['test']}",
        f"--checkpoint_dir_for_init={ckpt}",
        "--num_workers=1",
        "--num_ps_pods=1",
    )
    cli.submit(
        "predict",
        "recovery-predict",
        f"--prediction_data={small_data['test']}",
        f"--checkpoint_dir_for_init={ckpt}",
        "--num_workers=1",
        "--num_ps_pods=1",
    )
    evaluated = cli.wait_end("recovery-eval", timeout=300)
    assert evaluated["phase"] == "Succeeded", cli.master_log("recovery-eval")[-3000:]
    assert evaluated["evaluation_metrics"]["accuracy"] >= 0.65, evaluated["evaluation_metrics"]
    predicted = cli.wait_end("recovery-predict", timeout=300)
    assert predicted["phase"] == "Succeeded", cli.master_log("recovery-predict")[-3000:]
    assert predicted["records_predicted"] == 4096


def test_exported_saved_model_loads_and_predicts(recovery_job, small_data):
    import tensorflow as tf
    from elasticdl.common.model_utils import Mode
    from elasticdl.data.reader import create_data_reader
    from mnist.mnist_functional_api import feed

    path = recovery_job["saved_model"]
    assert (path / "saved_model.pb").is_file(), os.listdir(path.parent)
    reader = create_data_reader(str(small_data["test"]), records_per_task=None)
    shard = reader.create_shards()[0]
    records = list(reader.read_records(shard.name, 0, 512))
    images, labels = next(
        iter(feed(tf.data.Dataset.from_tensor_slices(records), Mode.EVALUATION, None).batch(512))
    )
    model = tf.saved_model.load(str(path))
    logits = model.serve(images).numpy()
    assert logits.shape == (512, 10)
    accuracy = float(np.mean(np.argmax(logits, axis=1) == labels.numpy()))
    assert accuracy >= 0.65, accuracy
