"""What one parameter server or worker is told: specs the master derives from the job spec.

A replica spec declares the fields its process needs. :func:`derive` fills every field whose
name is also a :class:`~elasticdl.common.job_spec.JobSpec` field from the job spec, and the
master supplies the rest (identity, addresses, the optimizer it read from the model), so no
list of forwarded flags exists anywhere. On the command line a replica spec is readable
``--field=value`` flags (``spec_codec.to_argv``), parsed back by the same codec with the same
types; unknown flags are errors.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence, TypeVar

from elasticdl.common import spec_codec
from elasticdl.common.job_spec.checks import check_fields, checked, non_negative, one_of, positive
from elasticdl.common.job_spec.fields import ALLREDUCE_BACKENDS
from elasticdl.common.spec_codec import SpecError
from elasticdl.common.types import JobType, Strategy

WORKER_MODULE = "elasticdl.worker.main"
PS_MODULE = "elasticdl.ps.main"


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    worker_id: int
    master_addr: str
    ps_addrs: tuple[str, ...]
    job_type: JobType
    num_workers: int
    distribution_strategy: Strategy
    # The model, as the master loaded it
    model_zoo: str
    model_def: str
    feed: str
    loss: str
    optimizer: str
    eval_metrics_fn: str
    callbacks: str
    custom_data_reader: str
    prediction_outputs_processor: str
    data_reader_params: str
    # The training loop
    minibatch_size: int = checked(positive)
    get_model_steps: int = checked(positive)
    log_loss_steps: int
    output: str
    log_level: str
    allreduce_backend: str = checked(one_of(ALLREDUCE_BACKENDS))
    # Seconds to keep retrying an unreachable master or PS before giving up. Long enough for a
    # PS lost with its node to be back: the node controller's grace period (40 s by default),
    # the pods' --node_lost_timeout (30 s), the deletion deadline and margin of
    # platform.k8s_lost_pods (45 s) and the new PS's start and restore; giving up sooner only
    # relaunches the worker, which must wait for that PS all the same.
    retry_timeout: float = 300.0
    # AllreduceStrategy: re-form the group and retry a failed allreduce this often.
    allreduce_retries: int = checked(non_negative, 5)
    # The PS apply pushes asynchronously: the worker then sends each push while it computes the
    # next minibatch (worker.ps_trainer), which a sync PS would reject as stale.
    use_async: bool = False
    # The original ElasticDL's model-file conventions (see common.model_utils.load_model_spec).
    dataset_fn: str = ""
    model_params: str = ""
    # Mutual TLS (elasticdl.common.tls): PEM files inside the replica's host or pod; "" = off.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    tls_server_name: str = ""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.distribution_strategy == Strategy.PARAMETER_SERVER and not self.ps_addrs:
            raise SpecError("--ps_addrs is empty: pass the PS addresses (host:port,...)")

    @property
    def allreduce(self) -> bool:
        return self.distribution_strategy == Strategy.ALLREDUCE


@dataclasses.dataclass(frozen=True)
class PSSpec:
    """Defaults let a PS be started by hand (``python -m elasticdl.ps.main --port=2222``);
    the master always writes every field."""

    ps_id: int = 0
    num_ps_pods: int = 1
    port: int = 2222  # 0: pick a free port (logged)
    master_addr: str = ""  # "": report no versions to a master
    job_name: str = ""
    num_workers: int = 0
    use_async: bool = False
    grads_to_wait: int = 1
    lr_staleness_modulation: bool = False
    sync_version_tolerance: int = 0
    evaluation_steps: int = 0
    checkpoint_dir: str = ""
    checkpoint_steps: int = 0
    keep_checkpoint_max: int = 0
    checkpoint_dir_for_init: str = ""
    # The optimizer the master read from the model: SGD | Momentum | Adam | Adagrad and its
    # hyper-parameters as "name=value;..."
    opt_type: str = "SGD"
    opt_args: str = ""
    log_level: str = "INFO"
    # "0.0.0.0" in a pod; loopback for local processes, which nothing else should reach.
    bind_host: str = "0.0.0.0"
    # The job's PS are processes on one machine: each counts on its share of the machine's
    # memory when it checks that the tables fit (elasticdl.ps.memory_fit).
    shared_host: bool = False
    log_every_versions: int = 100
    # The job's minibatch: with the model, it sizes the largest push this PS accepts
    # (elasticdl.common.message_caps).
    minibatch_size: int = checked(positive, 64)
    # Mutual TLS (elasticdl.common.tls): PEM files inside the replica's host or pod; "" = off.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    tls_server_name: str = ""

    def __post_init__(self) -> None:
        check_fields(self)


SpecT = TypeVar("SpecT", WorkerSpec, PSSpec)


def derive(cls: type[SpecT], job: Any, **values: Any) -> SpecT:
    """A replica spec whose fields come from ``values`` or, by name, from the job spec."""
    job_fields = {f.name for f in dataclasses.fields(job)}
    for f in dataclasses.fields(cls):
        if f.name not in values and f.name in job_fields:
            values[f.name] = getattr(job, f.name)
    return cls(**values)


def to_argv(spec: WorkerSpec | PSSpec) -> list[str]:
    return spec_codec.to_argv(spec)


def worker_spec_from_argv(argv: Sequence[str]) -> WorkerSpec:
    return spec_codec.from_argv(WorkerSpec, argv, prog=WORKER_MODULE)


def ps_spec_from_argv(argv: Sequence[str]) -> PSSpec:
    return spec_codec.from_argv(PSSpec, argv, prog=PS_MODULE)
