"""The specs of the job's parameter servers and workers, derived from the job spec, and the
platform launch descriptions (``LaunchSpec``) that carry them.

Everything a replica is told comes from the job spec by field name (``replica_spec.derive``)
or from :class:`ReplicaContext`: what the master learned while starting (its own address, the
model's optimizer, where the PS checkpoint, the replicas' environment).
"""

from __future__ import annotations

import dataclasses
import os
import re

from elasticdl.common import replica_spec
from elasticdl.common.auth import JOB_SECRET_ENV
from elasticdl.common.cpu_budget import WORKER_CPUS_ENV, share_per_worker
from elasticdl.common.job_spec import JobSpec, env_name_patterns
from elasticdl.common.replica_spec import PSSpec, WorkerSpec
from elasticdl.platform.base import LaunchSpec, Platform, ReplicaType


@dataclasses.dataclass(frozen=True)
class Checkpointing:
    """Where and how often the PS checkpoint (0 steps: never)."""

    directory: str = ""
    steps: int = 0
    keep: int = 0


@dataclasses.dataclass(frozen=True)
class ReplicaContext:
    master_addr: str
    opt_type: str = "SGD"
    opt_args: str = ""
    checkpointing: Checkpointing = Checkpointing()
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    # The job's secret (elasticdl.common.auth); every replica gets it, out of argv and logs.
    secret: str = dataclasses.field(default="", repr=False)


class LaunchSpecs:
    def __init__(self, job: JobSpec, platform: Platform, context: ReplicaContext) -> None:
        self.job = job
        self.platform = platform
        self.context = context
        # How many workers the job has when the next one starts (--num_workers=auto grows it).
        self.worker_count = job.num_workers
        # The PS set: how many, and which generation (0: the job's first; each change of the
        # PS count while the job runs makes the next, see master.ps_rescale).
        self.num_ps = job.num_ps_pods
        self.ps_generation = 0

    def ps_addrs(self) -> tuple[str, ...]:
        return tuple(self.platform.address(ReplicaType.PS, i) for i in range(self.num_ps))

    def set_ps_generation(self, generation: int, num_ps: int) -> None:
        """PS and workers launched from now on belong to PS set ``generation`` of ``num_ps``."""
        self.ps_generation, self.num_ps = generation, num_ps

    def worker_spec(self, worker_id: int) -> WorkerSpec:
        return replica_spec.derive(
            WorkerSpec,
            self.job,
            worker_id=worker_id,
            master_addr=self.context.master_addr,
            ps_addrs=self.ps_addrs(),
        )

    def ps_spec(self, ps_id: int) -> PSSpec:
        address = self.platform.address(ReplicaType.PS, ps_id)
        checkpointing = self.context.checkpointing
        return replica_spec.derive(
            PSSpec,
            self.job,
            ps_id=ps_id,
            num_ps_pods=self.num_ps,
            port=_port_of(address),
            bind_host=self.platform.traits.bind_host,
            shared_host=self.platform.traits.shared_host,
            master_addr=self.context.master_addr,
            checkpoint_dir=checkpointing.directory,
            checkpoint_steps=checkpointing.steps,
            keep_checkpoint_max=checkpointing.keep,
            opt_type=self.context.opt_type,
            opt_args=self.context.opt_args,
            **self._ps_restore_source(),
        )

    def _ps_restore_source(self) -> dict:
        """After a change of the PS set, a PS starts from the newest checkpoint of the job (the
        snapshot the change wrote, or a later periodic one), not the job's initial model."""
        return {"checkpoint_dir_for_init": ""} if self.ps_generation else {}

    def worker(self, worker_id: int) -> LaunchSpec:
        """What the platform launches for worker ``worker_id``."""
        job = self.job
        env = dict(self.context.env)
        user_set = WORKER_CPUS_ENV in env or WORKER_CPUS_ENV in os.environ
        if self.platform.traits.shared_host and not user_set:
            # Workers on one host size their thread pools for their share of its CPUs, not for
            # all of them (N workers x all CPUs threads would oversubscribe it).
            env[WORKER_CPUS_ENV] = str(share_per_worker(self.worker_count))
        return LaunchSpec(
            ReplicaType.WORKER,
            worker_id,
            module=replica_spec.WORKER_MODULE,
            args=replica_spec.to_argv(self.worker_spec(worker_id)),
            env=env,
            secret_env=self._secret_env(),
            resource_request=job.worker_resource_request,
            resource_limit=job.worker_resource_limit,
            image=job.worker_image or job.image_name,
        )

    def ps(self, ps_id: int) -> LaunchSpec:
        """What the platform launches for parameter server ``ps_id``."""
        job = self.job
        spec = self.ps_spec(ps_id)
        return LaunchSpec(
            ReplicaType.PS,
            ps_id,
            module=replica_spec.PS_MODULE,
            args=replica_spec.to_argv(spec),
            env=dict(self.context.env),
            secret_env=self._secret_env(),
            port=spec.port,
            resource_request=job.ps_resource_request,
            resource_limit=job.ps_resource_limit,
            priority=job.ps_pod_priority,
            image=job.worker_image or job.image_name,
        )

    def _secret_env(self) -> dict[str, str]:
        return {JOB_SECRET_ENV: self.context.secret} if self.context.secret else {}


def _port_of(address: str) -> int:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"platform returned a bad replica address {address!r}; expected host:port")
    return int(port)


def replica_env(job: JobSpec, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for workers and PS: ``--envs`` plus the master's variables whose names
    match ``--populate_env_names`` (comma-separated names or regexes)."""
    environ = dict(os.environ if environ is None else environ)
    env: dict[str, str] = {}
    for pattern in env_name_patterns(job.populate_env_names):
        regex = re.compile(pattern)
        for name, value in environ.items():
            if regex.fullmatch(name):
                env[name] = value
    env.update(job.env_vars())
    return env
