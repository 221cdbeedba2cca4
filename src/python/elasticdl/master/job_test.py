"""End to end: the master runs a real job with real PS and worker processes (LocalProcessPlatform)
on a tiny logistic-regression model and synthetic RecordIO data, and survives a worker SIGKILL."""

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
from elasticdl.common.args import parse_master_args
from elasticdl.data.example_codec import encode_example, float_feature, int64_feature
from elasticdl.data.recordio import Writer
from elasticdl.master.job import Job
from elasticdl.master.main import main
from elasticdl.platform.base import ReplicaType

ZOO = str(Path(__file__).parent / "testdata" / "zoo")


def _write_data(directory: Path, files: int, per_file: int, seed: int) -> str:
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for f in range(files):
        with Writer(directory / f"part-{f}.rio") as w:
            for _ in range(per_file):
                x = rng.normal(size=4).astype(np.float32)
                label = int(x[0] + x[1] > 0)  # linearly separable
                w.write(encode_example({"x": float_feature(x), "label": int64_feature(label)}))
    return str(directory)


def _args(tmp_path, **overrides):
    flags = {
        "job_name": "e2e",
        "model_zoo": ZOO,
        "model_def": "tiny.linear.custom_model",
        "training_data": _write_data(tmp_path / "train", 2, 96, 0),
        "validation_data": _write_data(tmp_path / "val", 1, 64, 1),
        "minibatch_size": 16,
        "num_minibatches_per_task": 1,
        "num_epochs": 2,
        "num_workers": 2,
        "num_ps_pods": 1,
        "evaluation_steps": 8,
        "platform": "local",
        "job_dir": str(tmp_path / "job"),
        "log_level": "INFO",
    }
    flags.update(overrides)
    return [f"--{k}={v}" for k, v in flags.items()]


def test_training_job_survives_worker_sigkill(tmp_path):
    args = parse_master_args(_args(tmp_path))
    job = Job(args)
    job.worker_exit_grace_s = 60
    killed = {}

    def killer():
        # As soon as some training is done, SIGKILL worker 0 (like a preempted pod).
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and job.phase != "Succeeded":
            if job.tm.summary().tasks_done >= 2:
                pid = job.platform.pid(ReplicaType.WORKER, 0)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed["pid"] = pid
                return
            time.sleep(0.05)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    code = job.run()
    t.join(timeout=5)
    status = json.loads((tmp_path / "job" / "status.json").read_text())
    assert code == 0, status["message"]
    assert status["phase"] == "Succeeded"
    # Exactly-once accounting: 2 epochs x 192 records despite the kill.
    assert status["records_trained"] == status["records_expected"] == 384
    assert status["records_trained_per_epoch"] == {"1": 192, "2": 192}
    replicas = {r["name"]: r for r in status["replicas"]}
    if killed:  # worker 0 was still alive when the killer struck
        assert replicas["worker-0"]["exit_code"] == 137
        assert replicas["worker-0"]["replaced_by"] == 2
        assert "worker-2" in replicas
    # The final evaluation ran and reported accuracy on the validation data.
    assert "accuracy" in status["evaluation_metrics"]
    assert status["evaluation_metrics"]["accuracy"] > 0.6
    assert all(r["phase"] in ("Succeeded", "Failed", "Deleted") for r in replicas.values())
    assert (tmp_path / "job" / "logs" / "ps-0.log").exists()
    assert (tmp_path / "job" / "logs" / "worker-1.log").exists()


def test_bad_flags_exit_2(tmp_path, capsys):
    assert (
        main(
            [
                "--job_name=x",
                "--model_zoo=" + ZOO,
                "--model_def=tiny.linear.nope",
                "--training_data=" + str(tmp_path),
                "--platform=local",
                "--job_dir=" + str(tmp_path / "j"),
            ]
        )
        == 2
    )
    assert "nope" in capsys.readouterr().err
