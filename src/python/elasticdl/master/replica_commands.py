"""The command lines of workers and parameter servers, derived from the master's flags.

Values are passed as ``--flag=value`` (one argv element each), so values that start with '-' or
contain spaces survive unchanged and no shell quoting is involved.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re

from elasticdl.common.cpu_budget import WORKER_CPUS_ENV, share_per_worker
from elasticdl.platform.base import Platform, ReplicaSpec, ReplicaType

WORKER_MODULE = "elasticdl.worker.main"
PS_MODULE = "elasticdl.ps.main"

# Model flags the worker needs verbatim from the job.
_WORKER_FORWARDED = (
    "model_zoo",
    "model_def",
    "minibatch_size",
    "feed",
    "loss",
    "optimizer",
    "eval_metrics_fn",
    "callbacks",
    "custom_data_reader",
    "data_reader_params",
    "log_level",
    "get_model_steps",
    "distribution_strategy",
    "prediction_outputs_processor",
    "output",
    "log_loss_steps",
)
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def _flag(name: str, value) -> str:
    if isinstance(value, bool):
        value = "true" if value else "false"
    return f"--{name}={value}"


def _or(override, default):
    return default if override is None else override


@dataclasses.dataclass
class ReplicaCommandConfig:
    """Everything the spec builders need besides the parsed job flags."""

    master_addr: str
    opt_type: str = "SGD"
    opt_args: str = ""
    checkpoint_dir: str = ""
    checkpoint_steps: int | None = None  # None: --checkpoint_steps of the job
    keep_checkpoint_max: int | None = None  # None: --keep_checkpoint_max of the job
    env: dict[str, str] = dataclasses.field(default_factory=dict)


class ReplicaCommands:
    def __init__(
        self, args: argparse.Namespace, platform: Platform, config: ReplicaCommandConfig
    ) -> None:
        self.args = args
        self.platform = platform
        self.config = config

    def ps_addrs(self) -> list[str]:
        return [self.platform.address(ReplicaType.PS, i) for i in range(self.args.num_ps_pods)]

    def worker_spec(self, worker_id: int) -> ReplicaSpec:
        a = self.args
        argv = [
            _flag("worker_id", worker_id),
            _flag("master_addr", self.config.master_addr),
            _flag("ps_addrs", ",".join(self.ps_addrs())),
            _flag("job_type", a.job_type),
            _flag("num_workers", a.num_workers),
        ]
        for name in _WORKER_FORWARDED:
            value = getattr(a, name, None)
            if value is None:
                continue
            if name == "model_zoo" and value:
                value = (
                    os.path.abspath(os.path.expanduser(value))
                    if _is_local(self.platform)
                    else value
                )
            argv.append(_flag(name, value))
        env = dict(self.config.env)
        user_set = WORKER_CPUS_ENV in env or WORKER_CPUS_ENV in os.environ
        if _is_local(self.platform) and not user_set:
            # Local workers share this host: each sizes its thread pools for its share of the
            # CPUs, not for all of them (N workers x all CPUs threads would oversubscribe it).
            env[WORKER_CPUS_ENV] = str(share_per_worker(a.num_workers))
        return ReplicaSpec(
            ReplicaType.WORKER,
            worker_id,
            module=WORKER_MODULE,
            args=argv,
            env=env,
            resource_request=a.worker_resource_request,
            resource_limit=a.worker_resource_limit,
            image=a.worker_image or a.image_name,
        )

    def ps_spec(self, ps_id: int) -> ReplicaSpec:
        a = self.args
        address = self.platform.address(ReplicaType.PS, ps_id)
        host, port = _split_host_port(address)
        argv = [
            _flag("ps_id", ps_id),
            _flag("num_ps_pods", a.num_ps_pods),
            _flag("port", port),
            _flag("master_addr", self.config.master_addr),
            _flag("job_name", a.job_name),
            _flag("use_async", a.use_async),
            _flag("grads_to_wait", a.grads_to_wait),
            _flag("lr_staleness_modulation", a.lr_staleness_modulation),
            _flag("sync_version_tolerance", a.sync_version_tolerance),
            _flag("evaluation_steps", a.evaluation_steps),
            _flag("checkpoint_dir", self.config.checkpoint_dir),
            _flag("checkpoint_steps", _or(self.config.checkpoint_steps, a.checkpoint_steps)),
            _flag(
                "keep_checkpoint_max", _or(self.config.keep_checkpoint_max, a.keep_checkpoint_max)
            ),
            _flag("checkpoint_dir_for_init", a.checkpoint_dir_for_init),
            _flag("num_workers", a.num_workers),
            _flag("opt_type", self.config.opt_type),
            _flag("opt_args", self.config.opt_args),
            _flag("log_level", a.log_level),
        ]
        if host in _LOOPBACK_HOSTS:
            # Local processes: listen on loopback only, like the master.
            argv.append(_flag("bind_host", "127.0.0.1"))
        return ReplicaSpec(
            ReplicaType.PS,
            ps_id,
            module=PS_MODULE,
            args=argv,
            env=dict(self.config.env),
            port=port,
            resource_request=a.ps_resource_request,
            resource_limit=a.ps_resource_limit,
            priority=a.ps_pod_priority,
            image=a.worker_image or a.image_name,
        )


def _is_local(platform: Platform) -> bool:
    return type(platform).__name__ == "LocalProcessPlatform"


def _split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"platform returned a bad replica address {address!r}; expected host:port")
    return host, int(port)


def replica_env(args: argparse.Namespace, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for workers and PS: ``--envs`` plus the master's variables whose names
    match ``--populate_env_names`` (comma-separated names or regexes)."""
    from elasticdl.common.args import parse_envs

    environ = dict(os.environ if environ is None else environ)
    env: dict[str, str] = {}
    patterns = [
        p.strip() for p in (getattr(args, "populate_env_names", "") or "").split(",") if p.strip()
    ]
    for pattern in patterns:
        try:
            regex = re.compile(pattern)
        except re.error as e:
            raise ValueError(f"--populate_env_names: {pattern!r} is not a valid regex ({e})") from e
        for name, value in environ.items():
            if regex.fullmatch(name):
                env[name] = value
    env.update(parse_envs(getattr(args, "envs", "") or ""))
    return env
