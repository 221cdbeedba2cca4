"""The field table: :class:`JobSpec`, every parameter of an ElasticDL job with its type,
default, help text, flag group, the commands that take it and its check."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from elasticdl.common import spec_codec
from elasticdl.common.job_spec import checks
from elasticdl.common.job_spec.checks import MAX_JOB_NAME_LENGTH
from elasticdl.common.job_spec.resolve import resolve
from elasticdl.common.job_spec.values import (
    aux_param_set,
    parse_envs,
    parse_pull_secrets,
    parse_secret_envs,
)
from elasticdl.common.types import JobType, PlatformName, Strategy

TRAIN, EVALUATE, PREDICT = "train", "evaluate", "predict"
JOB_COMMANDS = (TRAIN, EVALUATE, PREDICT)

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
IMAGE_PULL_POLICIES = ("Never", "IfNotPresent", "Always")
RESTART_POLICIES = ("Never", "OnFailure", "Always")
# --pod_security (elasticdl.k8s.security): the restricted securityContext, or the image's defaults.
POD_SECURITY_RESTRICTED, POD_SECURITY_NONE = "restricted", "none"
POD_SECURITY_MODES = (POD_SECURITY_RESTRICTED, POD_SECURITY_NONE)
ALLREDUCE_BACKENDS = ("auto", "gloo", "nccl")
DEFAULT_MASTER_PORT = 50001
# --num_workers=auto: the spelling of "the master sizes the job" (JobSpec.auto_workers).
AUTO_WORKERS = "auto"
DEFAULT_EXTRA_PYPI_INDEX = "https://pypi.org/simple"

_ALL = JOB_COMMANDS


def _field(
    default: Any,
    help: str,
    group: str,
    commands: tuple[str, ...] = _ALL,
    check: Callable[[str, Any], None] | None = None,
    choices: tuple[str, ...] = (),
    required: bool = False,
) -> Any:
    """A spec field. ``commands=()`` keeps it off the command line (set by the client or the
    master, or through the API)."""
    if choices and check is None:
        check = checks.one_of(choices)
    metadata = {
        "help": help,
        "group": group,
        "commands": commands,
        "check": check,
        "choices": choices,
        "required": required,
    }
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """One ElasticDL job. Field names are the flag names (``minibatch_size`` is
    ``--minibatch_size``). Constructing one checks every field; :meth:`resolve` fills the
    derived defaults and checks the fields against each other."""

    # ---- model -------------------------------------------------------------------------
    model_zoo: str = _field(
        "",
        "Directory holding the model definitions (the root of --model_def's module path)",
        "model",
    )
    model_def: str = _field(
        "",
        "Model function as a dotted path below --model_zoo, e.g. mnist.mnist_functional_api.custom_model",
        "model",
        check=checks.model_def,
    )
    minibatch_size: int = _field(64, "Records per minibatch", "model", check=checks.positive)
    feed: str = _field("feed", "Name of the feed (dataset) function in the model file", "model")
    dataset_fn: str = _field(
        "",
        "The original ElasticDL's name of --feed (default: 'feed', else 'dataset_fn' when the "
        "model file defines no 'feed')",
        "model",
    )
    model_params: str = _field(
        "",
        "Keyword arguments of the model function, 'k1=v1; k2=v2' (values as Python literals)",
        "model",
        check=checks.params,
    )
    loss: str = _field("loss", "Name of the loss function in the model file", "model")
    optimizer: str = _field(
        "optimizer", "Name of the optimizer function in the model file", "model"
    )
    callbacks: str = _field(
        "callbacks", "Name of the callbacks function in the model file", "model"
    )
    eval_metrics_fn: str = _field(
        "eval_metrics_fn", "Name of the evaluation-metrics function in the model file", "model"
    )
    custom_data_reader: str = _field(
        "custom_data_reader",
        "Name of the optional custom data reader factory in the model file",
        "model",
    )
    prediction_outputs_processor: str = _field(
        "PredictionOutputsProcessor",
        "Name of the prediction-outputs processor class in the model file",
        "predict",
        commands=(PREDICT,),
    )
    data_reader_params: str = _field(
        "",
        'Data reader parameters "k1=v1; k2=v2", e.g. \'columns=["a","b"]; label_col="y"\'',
        "model",
        check=checks.params,
    )
    log_level: str = _field("INFO", "Log level of every replica", "model", choices=LOG_LEVELS)
    get_model_steps: int = _field(
        1,
        "Pull the model from the PS every this many steps (forced to 1 for synchronous SGD)",
        "model",
        check=checks.positive,
    )
    distribution_strategy: Strategy = _field(
        Strategy.PARAMETER_SERVER,
        "ParameterServerStrategy (at least one PS) or AllreduceStrategy (workers only)",
        "model",
    )
    allreduce_backend: str = _field(
        "auto",
        "AllreduceStrategy: torch.distributed backend (auto: NCCL when every worker has a GPU of its "
        "own, else Gloo)",
        "model",
        choices=ALLREDUCE_BACKENDS,
    )
    checkpoint_steps: int = _field(
        0, "Checkpoint every N model versions (0: off)", "model", check=checks.non_negative
    )
    checkpoint_dir: str = _field("", "Directory for checkpoints", "model")
    keep_checkpoint_max: int = _field(
        0, "Checkpoints to keep (0: keep all)", "model", check=checks.non_negative
    )
    output: str = _field("", "Where the trained model is exported (SavedModel)", "model")

    # ---- data --------------------------------------------------------------------------
    training_data: str = _field(
        "", "Training data (e.g. a RecordIO directory)", "data", commands=(TRAIN,)
    )
    validation_data: str = _field(
        "",
        "Validation data (train: evaluated during training; evaluate: required)",
        "data",
        commands=(TRAIN, EVALUATE),
    )
    prediction_data: str = _field("", "Data to predict on (required)", "data", commands=(PREDICT,))
    checkpoint_dir_for_init: str = _field(
        "",
        "Checkpoint to initialise the model from (evaluate and predict: required)",
        "data",
    )
    num_minibatches_per_task: int = _field(
        8, "Minibatches per task (data shard)", "data", check=checks.positive
    )

    # ---- training ----------------------------------------------------------------------
    num_epochs: int = _field(
        1, "Epochs to train (<= 0: until stopped)", "training", commands=(TRAIN,)
    )
    max_step: int = _field(
        0,
        "Stop after this many steps (0: no limit)",
        "training",
        commands=(TRAIN,),
        check=checks.non_negative,
    )
    evaluation_steps: int = _field(
        0,
        "Evaluate every N model versions (0: only at the end)",
        "training",
        commands=(TRAIN,),
        check=checks.non_negative,
    )
    evaluation_start_delay_secs: int = _field(
        100,
        "Time-based evaluation: the first one not before this many seconds after the job starts",
        "training",
        commands=(TRAIN,),
        check=checks.non_negative,
    )
    evaluation_throttle_secs: int = _field(
        0,
        "Time-based evaluation: evaluate the newest model at most once every this many seconds "
        "(0: off)",
        "training",
        commands=(TRAIN,),
        check=checks.non_negative,
    )
    tensorboard_log_dir: str = _field(
        "",
        "Directory the master writes TensorBoard event files into (training loss, evaluation "
        "metrics)",
        "training",
        commands=(TRAIN, EVALUATE),
    )
    log_loss_steps: int = _field(
        100,
        "Log the loss every N steps (0: never)",
        "training",
        commands=(TRAIN,),
        check=checks.non_negative,
    )
    use_async: bool = _field(False, "Asynchronous SGD", "training", commands=(TRAIN,))
    grads_to_wait: int = _field(
        1,
        "Gradients the PS waits for (sync SGD)",
        "training",
        commands=(TRAIN,),
        check=checks.positive,
    )
    sync_version_tolerance: int = _field(
        0,
        "Staleness tolerated in sync SGD",
        "training",
        commands=(TRAIN,),
        check=checks.non_negative,
    )
    lr_staleness_modulation: bool = _field(
        False, "Scale the learning rate by gradient staleness", "training", commands=(TRAIN,)
    )
    relaunch_on_worker_failure: int = _field(
        1,
        "Relaunches allowed per failed worker",
        "training",
        commands=(TRAIN,),
        check=checks.non_negative,
    )
    relaunch_timeout_worker: bool = _field(
        False, "Relaunch workers whose tasks time out", "training", commands=(TRAIN,)
    )
    task_timeout: int = _field(
        300,
        "Seconds a task may run before the master takes it back for another worker (or 3x the "
        "longest task so far, if longer)",
        "training",
        check=checks.positive,
    )
    straggler_factor: float = _field(
        3.0,
        "A worker this many times slower per record than the median of the others is a "
        "straggler: near the end of the data it gets no more than its share of the work and "
        "idle workers back up its tasks (first report counts; 0: off)",
        "training",
        check=checks.straggler_factor,
    )

    # ---- job ---------------------------------------------------------------------------
    job_name: str = _field(
        "",
        f"Unique job name: lowercase letters, digits and '-', at most {MAX_JOB_NAME_LENGTH} characters",
        "job",
        check=checks.job_name,
        required=True,
    )
    platform: PlatformName | None = _field(
        None,
        "Where the job runs: local processes or Kubernetes pods (default: kubernetes when "
        "--image_name is given, else local)",
        "job",
    )
    job_dir: str = _field(
        "",
        "Job directory with status, logs and the master's journal (local default: "
        "~/.elasticdl/jobs/<job_name>); on Kubernetes a path under a writable --volume, which "
        "makes the master restartable (a Job starts a new one that resumes the job)",
        "job",
    )
    num_workers: int = _field(
        2,
        "Number of workers, or 'auto': the master starts --min_workers and adds workers while "
        "each pays for its CPU (or, with --autoscale_min_gain, raises the job's records/s by "
        "that much), up to --max_workers",
        "job",
        check=checks.positive,
    )
    min_workers: int = _field(
        1, "With --num_workers=auto: the workers the job starts with", "job", check=checks.positive
    )
    max_workers: int = _field(
        8, "With --num_workers=auto: the most workers the job gets", "job", check=checks.positive
    )
    autoscale_min_gain: float | None = _field(
        None,
        "With --num_workers=auto: keep a worker only when it raised the job's records/s by at "
        "least this fraction, whatever its CPU (track throughput). Default: by at least 0.1 and "
        "its CPU's share of the job's CPU before it, so records per CPU second do not fall",
        "job",
        check=checks.optional_fraction,
    )
    autoscale_pending_timeout: int = _field(
        120,
        "With --num_workers=auto: seconds an added worker may take to start its first task; "
        "one still not running then (on Kubernetes: Pending, no room in the cluster) counts as "
        "not added and is deleted",
        "job",
        check=checks.positive,
    )
    auto_workers: bool = _field(
        False, "The master sizes the job (--num_workers=auto)", "job", commands=()
    )
    num_ps_pods: int = _field(
        0,
        "Number of parameter servers (0 with ParameterServerStrategy means 1)",
        "job",
        check=checks.non_negative,
    )
    envs: str = _field(
        "", "Environment of master, workers and PS: 'k1=v1,k2=v2'", "job", check=checks.envs
    )
    secret_envs: str = _field(
        "",
        "Kubernetes: environment of master, workers and PS read from Secrets of the namespace, "
        "'NAME=secret/key,...'; the kubelet reads the values, which appear in no argv, job spec "
        "or pod spec",
        "job",
        check=checks.secret_envs,
    )
    populate_env_names: str = _field(
        "",
        "Names or regexes (comma-separated) of master environment variables copied to workers and PS",
        "job",
        check=checks.env_patterns,
    )
    aux_params: str = _field(
        "", "Auxiliary parameters: disable_relaunch", "job", check=checks.aux_params
    )
    log_file_path: str = _field("", "Also write the master log to this file", "job")
    tls_cert_file: str = _field(
        "",
        "Mutual TLS between the job's replicas: this job's PEM certificate (with --tls_key_file "
        "and --tls_ca_file; the job secret is checked as well)",
        "job",
    )
    tls_key_file: str = _field("", "Mutual TLS: the PEM private key of --tls_cert_file", "job")
    tls_ca_file: str = _field(
        "", "Mutual TLS: the PEM CA certificate every replica's certificate must chain to", "job"
    )
    tls_server_name: str = _field(
        "",
        "Mutual TLS: the name channels expect in the servers' certificate instead of the host of "
        "the address they dial",
        "job",
    )
    job_type: JobType | None = _field(
        None, "What the job does (default: from the command and the data given)", "job", commands=()
    )
    port: int = _field(
        DEFAULT_MASTER_PORT, "Master gRPC port", "job", commands=(), check=checks.port
    )

    # ---- kubernetes --------------------------------------------------------------------
    image_name: str = _field(
        "", "Docker image of the job (Kubernetes)", "kubernetes", check=checks.image
    )
    image_base: str = _field(
        "",
        "Kubernetes: build the job's image on this base image from the local --model_zoo at "
        "submit time (pushed with --docker_image_prefix); with an --model_zoo path that exists "
        "only in the image (e.g. /model_zoo), run this pre-built image as it is",
        "kubernetes",
        check=checks.image,
    )
    docker_image_prefix: str = _field(
        "",
        "Registry prefix the image built from --image_base is pushed to as "
        "<prefix>elasticdl:<content tag> (default: built but not pushed, for a one-node cluster "
        "whose engine builds it)",
        "kubernetes",
        check=checks.image_prefix,
    )
    worker_image: str = _field(
        "", "Image of workers and PS (default: --image_name)", "kubernetes", check=checks.image
    )
    namespace: str = _field("default", "Kubernetes namespace", "kubernetes", check=checks.namespace)
    kube_context: str = _field(
        "", "kubeconfig context (default: the current context)", "kubernetes"
    )
    force_use_kube_config_file: bool = _field(
        False, "Use the kubeconfig file even inside a cluster", "kubernetes"
    )
    master_resource_request: str = _field(
        "cpu=0.1,memory=1024Mi",
        "Master resources, e.g. cpu=1,memory=2048Mi",
        "kubernetes",
        check=checks.resource,
    )
    master_resource_limit: str = _field(
        "", "Master resource limit (default: the request)", "kubernetes", check=checks.resource
    )
    worker_resource_request: str = _field(
        "cpu=1,memory=4096Mi",
        "Worker resources, e.g. cpu=1,memory=4096Mi,gpu=1",
        "kubernetes",
        check=checks.resource,
    )
    worker_resource_limit: str = _field(
        "", "Worker resource limit (default: the request)", "kubernetes", check=checks.resource
    )
    ps_resource_request: str = _field(
        "cpu=1,memory=4096Mi", "PS resources", "kubernetes", check=checks.resource
    )
    ps_resource_limit: str = _field(
        "", "PS resource limit (default: the request)", "kubernetes", check=checks.resource
    )
    master_pod_priority: str = _field("", "PriorityClass of the master pod", "kubernetes")
    worker_pod_priority: str = _field(
        "",
        "Worker priority: high, low, or a fraction like 0.5 (that share of the workers is high)",
        "kubernetes",
        check=checks.worker_priority,
    )
    ps_pod_priority: str = _field("", "PriorityClass of the PS pods", "kubernetes")
    node_lost_timeout: int = _field(
        30,
        "Seconds the job's pods stay bound to a node that is NotReady or unreachable before "
        "Kubernetes evicts them and the master replaces them on another node (Kubernetes' "
        "default: 300)",
        "kubernetes",
        check=checks.non_negative,
    )
    volume: str = _field(
        "",
        "Volumes: 'claim_name=c1,mount_path=/p;host_path=/h,mount_path=/q[,type=Directory][,sub_path=s]'"
        " or a Secret's keys as files: 'secret_name=s,mount_path=/etc/tls'",
        "kubernetes",
        check=checks.volume,
    )
    image_pull_policy: str = _field(
        "Always", "Image pull policy", "kubernetes", choices=IMAGE_PULL_POLICIES
    )
    image_pull_secrets: str = _field(
        "",
        "Secrets of the namespace (type kubernetes.io/dockerconfigjson, comma-separated) the "
        "kubelet pulls the job's images with, for a registry that needs credentials to pull: "
        "every pod's imagePullSecrets (no one reads them but the kubelet)",
        "kubernetes",
        check=checks.pull_secrets,
    )
    restart_policy: str = _field(
        "Never", "Pod restart policy", "kubernetes", choices=RESTART_POLICIES
    )
    pod_security: str = _field(
        POD_SECURITY_RESTRICTED,
        "Pods' securityContext: restricted (non-root user 10001, no privilege escalation, no "
        "capabilities, seccomp RuntimeDefault, read-only root filesystem with a writable /tmp) "
        "or none (the image's defaults, for images that must run as root)",
        "kubernetes",
        choices=POD_SECURITY_MODES,
    )
    cluster_spec: str = _field(
        "", "Python file defining `cluster` with with_pod/with_service patchers", "kubernetes"
    )
    cluster_spec_json: str = _field(
        "",
        "JSON with pod_spec/service_spec/master_pod_spec/worker_pod_spec/ps_pod_spec patches",
        "kubernetes",
    )
    extra_pypi_index: str = _field(
        DEFAULT_EXTRA_PYPI_INDEX, "Extra PyPI index for images", "kubernetes"
    )

    def __post_init__(self) -> None:
        if isinstance(self.log_level, str):
            object.__setattr__(self, "log_level", self.log_level.upper())
        if isinstance(self.num_workers, str) and self.num_workers.strip().lower() == AUTO_WORKERS:
            # Sized by the master: it starts with the minimum.
            object.__setattr__(self, "auto_workers", True)
            object.__setattr__(self, "num_workers", self.min_workers)
        checks.check_fields(self)

    # ---- derived values ----------------------------------------------------------------
    @property
    def allreduce(self) -> bool:
        return self.distribution_strategy == Strategy.ALLREDUCE

    @property
    def is_local(self) -> bool:
        return self.platform == PlatformName.LOCAL

    @property
    def records_per_task(self) -> int:
        return self.minibatch_size * self.num_minibatches_per_task

    def env_vars(self) -> dict[str, str]:
        return parse_envs(self.envs)

    def pull_secret_names(self) -> list[str]:
        """``--image_pull_secrets`` as a list of Secret names."""
        return parse_pull_secrets(self.image_pull_secrets)

    def secret_env_refs(self) -> dict[str, tuple[str, str]]:
        """``--secret_envs`` as variable -> (Secret name, key)."""
        return parse_secret_envs(self.secret_envs)

    def aux_param_set(self) -> set[str]:
        return aux_param_set(self.aux_params)

    def replace(self, **changes: Any) -> "JobSpec":
        return dataclasses.replace(self, **changes)

    # ---- serialisation -----------------------------------------------------------------
    def to_dict(self, only_changed: bool = False) -> dict[str, Any]:
        return spec_codec.to_dict(self, only_changed)

    def to_json(self, only_changed: bool = True, indent: int | None = None) -> str:
        return spec_codec.to_json(self, only_changed, indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JobSpec":
        data = dict(data)
        if str(data.get("num_workers", "")).strip().lower() == AUTO_WORKERS:
            data.pop("num_workers")
            data["auto_workers"] = True
        return spec_codec.from_dict(cls, data, "job spec")

    @classmethod
    def from_json(cls, text: str) -> "JobSpec":
        return spec_codec.from_json(cls, text, "job spec")

    # ---- the whole job -----------------------------------------------------------------

    # ---- the whole job -----------------------------------------------------------------
    def resolve(self, check_local_paths: bool | None = None) -> tuple["JobSpec", list[str]]:
        """Fill the derived defaults and check the fields against each other
        (:func:`elasticdl.common.job_spec.resolve.resolve`): the resolved spec and notices for
        the user about what was decided."""
        return resolve(self, check_local_paths)


FIELDS = {f.name: f for f in dataclasses.fields(JobSpec)}
