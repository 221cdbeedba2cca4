import argparse

from elasticdl.common.cpu_budget import WORKER_CPUS_ENV, share_per_worker
from elasticdl.master.replica_commands import ReplicaCommandConfig, ReplicaCommands
from elasticdl.platform.local import LocalProcessPlatform


def _args(num_workers):
    return argparse.Namespace(
        job_type="training_only",
        num_workers=num_workers,
        num_ps_pods=1,
        model_zoo="model_zoo",
        model_def="m.custom_model",
        worker_resource_request="",
        worker_resource_limit="",
        worker_image="",
        image_name="",
    )


def _worker_env(platform, num_workers, env=None):
    commands = ReplicaCommands(
        _args(num_workers), platform, ReplicaCommandConfig("127.0.0.1:1", env=env or {})
    )
    return commands.worker_spec(0).env


class _RemotePlatform(LocalProcessPlatform):
    """Another platform (say Kubernetes): workers do not share the master's host."""


def test_local_workers_get_their_share_of_the_host_cpus(tmp_path, monkeypatch):
    monkeypatch.delenv(WORKER_CPUS_ENV, raising=False)
    platform = LocalProcessPlatform("j", tmp_path)
    try:
        for workers in (1, 2, 3):
            assert _worker_env(platform, workers)[WORKER_CPUS_ENV] == str(share_per_worker(workers))
        # The user's own value (--envs, or exported where the master runs) is kept.
        assert _worker_env(platform, 2, {WORKER_CPUS_ENV: "7"})[WORKER_CPUS_ENV] == "7"
        monkeypatch.setenv(WORKER_CPUS_ENV, "5")
        assert WORKER_CPUS_ENV not in _worker_env(platform, 2)  # inherited from the master
    finally:
        platform.shutdown()


def test_workers_of_other_platforms_size_for_their_own_machine(tmp_path, monkeypatch):
    monkeypatch.delenv(WORKER_CPUS_ENV, raising=False)
    platform = _RemotePlatform("j", tmp_path)
    try:
        assert WORKER_CPUS_ENV not in _worker_env(platform, 4)
    finally:
        platform.shutdown()
