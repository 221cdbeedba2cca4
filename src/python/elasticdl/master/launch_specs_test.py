"""What the master tells each replica: derived from the job spec by field name."""

import dataclasses

import pytest
from elasticdl.common import replica_spec
from elasticdl.common.cpu_budget import WORKER_CPUS_ENV, share_per_worker
from elasticdl.common.job_spec import JobSpec
from elasticdl.common.replica_spec import PSSpec, WorkerSpec
from elasticdl.common.spec_codec import SpecError
from elasticdl.master.launch_specs import Checkpointing, LaunchSpecs, ReplicaContext, replica_env
from elasticdl.platform.base import PlatformTraits
from elasticdl.platform.local import LocalProcessPlatform
from elasticdl.ps.server import PSConfig


def _job(**changes) -> JobSpec:
    spec, _ = JobSpec(
        job_name="j",
        model_zoo="/zoo",
        model_def="m.mod.custom_model",
        training_data="/data",
        **changes,
    ).resolve(check_local_paths=False)
    return spec


def _specs(platform, job=None, env=None, **context) -> LaunchSpecs:
    return LaunchSpecs(
        job or _job(), platform, ReplicaContext("127.0.0.1:1", env=env or {}, **context)
    )


class _RemotePlatform(LocalProcessPlatform):
    """Another platform (say Kubernetes): workers do not share the master's host."""

    @property
    def traits(self) -> PlatformTraits:
        return PlatformTraits()


def test_worker_spec_comes_from_the_job_spec_and_survives_its_command_line(tmp_path):
    platform = LocalProcessPlatform("j", tmp_path)
    try:
        job = _job(minibatch_size=32, log_loss_steps=0, num_ps_pods=2, output="/out")
        specs = _specs(platform, job)
        launched = specs.worker(3)
        spec = replica_spec.worker_spec_from_argv(launched.args)
        assert spec == specs.worker_spec(3)
        assert spec.minibatch_size == 32 and spec.log_loss_steps == 0 and spec.output == "/out"
        assert spec.worker_id == 3 and spec.master_addr == "127.0.0.1:1"
        assert spec.ps_addrs == specs.ps_addrs() and len(spec.ps_addrs) == 2
        assert spec.job_type == "training_only" and spec.model_zoo == "/zoo"
        assert launched.module == "elasticdl.worker.main"
    finally:
        platform.shutdown()


def test_ps_spec_carries_the_masters_decisions(tmp_path):
    platform = LocalProcessPlatform("j", tmp_path)
    try:
        specs = _specs(
            platform,
            _job(use_async=True, grads_to_wait=2),
            opt_type="Adam",
            opt_args="learning_rate=0.01;",
            checkpointing=Checkpointing("/ckpt", 100, 2),
        )
        launched = specs.ps(0)
        spec = replica_spec.ps_spec_from_argv(launched.args)
        assert spec == specs.ps_spec(0)
        assert spec.use_async is True and spec.grads_to_wait == 2
        assert (spec.opt_type, spec.opt_args) == ("Adam", "learning_rate=0.01;")
        assert (spec.checkpoint_dir, spec.checkpoint_steps, spec.keep_checkpoint_max) == (
            "/ckpt",
            100,
            2,
        )
        assert spec.bind_host == "127.0.0.1"  # local processes listen on loopback only
        assert spec.shared_host is True  # its memory is split over the job's PS
        assert f"127.0.0.1:{spec.port}" == platform.address("ps", 0) and launched.port == spec.port
    finally:
        platform.shutdown()


def test_every_ps_spec_field_reaches_the_ps_config():
    spec = replica_spec.derive(
        PSSpec,
        _job(
            use_async=True,
            grads_to_wait=3,
            sync_version_tolerance=4,
            evaluation_steps=5,
            validation_data="/v",
        ),
        ps_id=1,
        num_ps_pods=2,
        port=1234,
        bind_host="::",
        master_addr="m:1",
        checkpoint_dir="/c",
        checkpoint_steps=6,
        keep_checkpoint_max=7,
        opt_type="Adam",
        opt_args="learning_rate=0.5;",
        log_every_versions=8,
    )
    config = PSConfig.from_spec(spec)
    for f in dataclasses.fields(PSSpec):
        if f.name != "log_level":  # the process's logging, not the server's
            assert getattr(config, f.name) == getattr(spec, f.name), f.name


def test_local_workers_get_their_share_of_the_host_cpus(tmp_path, monkeypatch):
    monkeypatch.delenv(WORKER_CPUS_ENV, raising=False)
    platform = LocalProcessPlatform("j", tmp_path)
    try:
        for workers in (1, 2, 3):
            env = _specs(platform, _job(num_workers=workers)).worker(0).env
            assert env[WORKER_CPUS_ENV] == str(share_per_worker(workers))
        # The user's own value (--envs, or exported where the master runs) is kept.
        env = _specs(platform, env={WORKER_CPUS_ENV: "7"}).worker(0).env
        assert env[WORKER_CPUS_ENV] == "7"
        monkeypatch.setenv(WORKER_CPUS_ENV, "5")
        assert WORKER_CPUS_ENV not in _specs(platform).worker(0).env  # inherited from the master
    finally:
        platform.shutdown()


def test_workers_of_other_platforms_size_for_their_own_machine(tmp_path, monkeypatch):
    monkeypatch.delenv(WORKER_CPUS_ENV, raising=False)
    platform = _RemotePlatform("j", tmp_path)
    try:
        assert WORKER_CPUS_ENV not in _specs(platform, _job(num_workers=4)).worker(0).env
        assert _specs(platform).ps_spec(0).bind_host == "0.0.0.0"
        assert _specs(platform).ps_spec(0).shared_host is False
    finally:
        platform.shutdown()


def test_replica_env_from_envs_and_populated_names():
    job = _job(envs="A=1,B=x,y", populate_env_names="EDL_.*,HOME")
    env = replica_env(job, {"EDL_X": "1", "EDL_Y": "2", "HOME": "/h", "OTHER": "o"})
    assert env == {"EDL_X": "1", "EDL_Y": "2", "HOME": "/h", "A": "1", "B": "x,y"}


def test_worker_spec_rejects_what_a_worker_cannot_run():
    argv = _argv_of_a_worker()
    with pytest.raises(SpecError, match="--ps_addrs is empty"):
        replica_spec.worker_spec_from_argv(argv + ["--ps_addrs="])
    with pytest.raises(SpecError, match="unrecognized arguments: --bogus=1"):
        replica_spec.worker_spec_from_argv(argv + ["--bogus=1"])
    with pytest.raises(SpecError, match="--minibatch_size: expected an integer"):
        replica_spec.worker_spec_from_argv(argv + ["--minibatch_size=x"])
    with pytest.raises(SpecError, match="--minibatch_size must be > 0"):
        replica_spec.worker_spec_from_argv(argv + ["--minibatch_size=0"])


def _argv_of_a_worker() -> list[str]:
    spec = replica_spec.derive(
        WorkerSpec, _job(), worker_id=0, master_addr="m:1", ps_addrs=("p:2",)
    )
    return replica_spec.to_argv(spec)


def test_a_job_field_reaches_the_worker_by_its_name(tmp_path):
    # --allreduce_backend is one JobSpec field; nothing else names it on its way to the worker.
    platform = LocalProcessPlatform("j", tmp_path)
    try:
        job = _job(distribution_strategy="AllreduceStrategy", allreduce_backend="gloo")
        argv = _specs(platform, job).worker(0).args
        assert "--allreduce_backend=gloo" in argv
        assert replica_spec.worker_spec_from_argv(argv).allreduce_backend == "gloo"
    finally:
        platform.shutdown()


def test_the_worker_knows_whether_the_ps_apply_pushes_asynchronously(tmp_path):
    # The worker overlaps its pushes with the next step only then (worker.ps_trainer).
    platform = LocalProcessPlatform("j", tmp_path)
    try:
        for use_async in (False, True):
            argv = _specs(platform, _job(use_async=use_async)).worker(0).args
            assert replica_spec.worker_spec_from_argv(argv).use_async is use_async
    finally:
        platform.shutdown()


def _k8s_platform():
    pytest.importorskip("kubernetes")
    from elasticdl.platform.kubernetes import KubernetesPlatform
    from elasticdl.platform.kubernetes_test import _FakeK8s

    return KubernetesPlatform("j", _FakeK8s(), image="img")


@pytest.mark.parametrize("num_ps", [1, 3])
def test_a_changed_ps_set_reaches_new_ps_and_workers_on_kubernetes(num_ps):
    """After the PS count changed (master.ps_rescale), a PS is launched for the new count, at
    its own Service, restoring the newest checkpoint (not the job's initial model); a worker
    launched from then on routes to the new set."""
    platform = _k8s_platform()
    try:
        specs = _specs(
            platform,
            _job(num_ps_pods=2, checkpoint_dir_for_init="/init/version-5"),
            checkpointing=Checkpointing("/ckpt", 100, 2),
        )
        assert replica_spec.ps_spec_from_argv(specs.ps(1).args).checkpoint_dir_for_init
        specs.set_ps_generation(1, num_ps)
        for ps_id in range(num_ps):
            launched = specs.ps(ps_id)
            spec = replica_spec.ps_spec_from_argv(launched.args)
            assert (spec.ps_id, spec.num_ps_pods) == (ps_id, num_ps)
            assert spec.checkpoint_dir == "/ckpt" and spec.checkpoint_dir_for_init == ""
            host, _, port = platform.address("ps", ps_id).rpartition(":")
            assert host.startswith("elasticdl-j-ps-") and launched.port == spec.port == int(port)
        worker = replica_spec.worker_spec_from_argv(specs.worker(0).args)
        assert worker.ps_addrs == tuple(platform.address("ps", i) for i in range(num_ps))
    finally:
        platform.shutdown(delete_all=False)
