"""End to end: the master runs a real job with real PS and worker processes (LocalProcessPlatform)
on a tiny logistic-regression model and synthetic RecordIO data, and survives a worker SIGKILL."""

import json
from pathlib import Path

import numpy as np
from elasticdl.common.job_spec import JobSpec
from elasticdl.data.example_codec import encode_example, float_feature, int64_feature
from elasticdl.data.recordio import Writer
from elasticdl.master.job import Job
from elasticdl.master.main import main
from elasticdl_testing.worker_kill import run_killing_worker

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


def _spec(tmp_path, **overrides) -> JobSpec:
    values = {
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
    values.update(overrides)
    spec, _ = JobSpec(**values).resolve()
    return spec


def test_training_job_survives_worker_sigkill(tmp_path):
    job = Job(_spec(tmp_path))
    job.worker_exit_grace_s = 60
    # As soon as some training is done, SIGKILL worker 0 (like a preempted pod).
    code, killed = run_killing_worker(job, lambda: job.tm.summary().tasks_done >= 2, 200)
    status = json.loads((tmp_path / "job" / "status.json").read_text())
    assert code == 0, status["message"]
    assert status["phase"] == "Succeeded"
    # Exactly-once accounting: 2 epochs x 192 records despite the kill.
    assert status["records_trained"] == status["records_expected"] == 384
    assert status["records_trained_per_epoch"] == {"1": 192, "2": 192}
    replicas = {r["name"]: r for r in status["replicas"]}
    if killed is not None:  # worker 0 was still alive when the killer struck
        assert replicas["worker-0"]["exit_code"] == 137
        assert replicas["worker-0"]["replaced_by"] == 2
        assert "worker-2" in replicas
    # The final evaluation ran and reported accuracy on the validation data.
    assert "accuracy" in status["evaluation_metrics"]
    assert status["evaluation_metrics"]["accuracy"] > 0.6
    assert all(r["phase"] in ("Succeeded", "Failed", "Deleted") for r in replicas.values())
    # Every task is some worker's: 2 epochs of 12 single-minibatch tasks, plus those re-run.
    workers = [r for r in replicas.values() if r["type"] == "worker"]
    assert sum(r["tasks_done"] for r in workers) >= 24, workers
    assert replicas["ps-0"]["tasks_done"] == 0
    assert (tmp_path / "job" / "logs" / "ps-0.log").exists()
    # The job's secret: readable by its owner only, and in no log or argv of a replica.
    secret_file = tmp_path / "job" / "job_secret"
    assert secret_file.stat().st_mode & 0o777 == 0o600
    secret = secret_file.read_text()
    assert len(secret) == 64
    for log in (tmp_path / "job" / "logs").iterdir():
        assert secret not in log.read_text(errors="replace"), log.name
    assert (tmp_path / "job" / "logs" / "worker-1.log").exists()


def test_bad_model_exits_2(tmp_path, capsys):
    spec = JobSpec(
        job_name="x",
        model_zoo=ZOO,
        model_def="tiny.linear.nope",
        training_data=str(tmp_path),
        platform="local",
        job_dir=str(tmp_path / "j"),
    )
    assert main([f"--job_spec={spec.to_json()}"]) == 2
    assert "nope" in capsys.readouterr().err


def test_bad_job_spec_exits_2_with_one_line(tmp_path, capsys):
    for argv, message in (
        (["--job_spec={not json"], "job spec is not valid JSON"),
        (['--job_spec={"job_name": "x", "minibatch_size": 0}'], "--minibatch_size must be > 0"),
        (['--job_spec={"job_name": "x", "num_wokers": 1}'], "unknown field(s) num_wokers"),
        ([f"--job_spec_file={tmp_path / 'missing.json'}"], "--job_spec_file: cannot read"),
        ([], "one of the arguments --job_spec --job_spec_file is required"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_master_reads_the_spec_file_the_client_writes(tmp_path):
    from elasticdl.master.main import read_job_spec

    spec = _spec(tmp_path, minibatch_size=8)
    path = tmp_path / "job_spec.json"
    path.write_text(spec.to_json(only_changed=False))
    assert read_job_spec([f"--job_spec_file={path}"]) == spec


def test_an_auto_sized_job_gives_its_autoscaler_the_pending_timeout(tmp_path):
    job = Job(_spec(tmp_path, num_workers="auto", max_workers=3, autoscale_pending_timeout=25))
    try:
        config = job.autoscaler.config
        assert (config.min_workers, config.max_workers) == (1, 3)
        assert config.pending_timeout_s == 25
    finally:
        job._server.stop(grace=0)


def test_an_auto_sized_job_measures_local_cpu_and_counts_pods_by_their_reports(tmp_path):
    from elasticdl.platform.base import PlatformTraits
    from elasticdl.platform.local import LocalProcessPlatform

    local = Job(_spec(tmp_path / "local", num_workers="auto", max_workers=3))
    try:
        cpu = local.autoscaler._cpu
        assert cpu.source == "measured"
        assert local._replica_processes() == {}  # none launched yet: the master alone
    finally:
        local._server.stop(grace=0)

    class PodLike(LocalProcessPlatform):  # replicas elsewhere: they report what they use
        @property
        def traits(self):
            # Any free port: another job on this machine may hold the default one.
            return PlatformTraits(bind_host="127.0.0.1", port_may_be_taken=True)

    spec = _spec(
        tmp_path / "pods",
        num_workers="auto",
        max_workers=3,
        master_resource_request="cpu=0.2,memory=1024Mi",
        ps_resource_request="cpu=0.2,memory=1024Mi",
        worker_resource_request="cpu=300m,memory=1024Mi",
    )
    pods = Job(spec, platform=PodLike("e2e", tmp_path / "pods" / "job"))
    try:
        cpu = pods.autoscaler._cpu
        assert cpu.source == "reported"
        # Until the pods have reported across a window: what they reserve.
        assert abs(cpu.cores(cpu.mark(), 2) - (0.2 + 0.2 + 2 * 0.3)) < 1e-9
        assert cpu.source == "requests"
        # The servicer files the replicas' reports where the job's CPU reads them.
        assert pods.servicer._cpu_reports is pods.cpu_reports
    finally:
        pods._server.stop(grace=0)
