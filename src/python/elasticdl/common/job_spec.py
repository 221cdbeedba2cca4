"""The job spec: every parameter of an ElasticDL job, defined once.

:class:`JobSpec` is a frozen dataclass; each field carries its type, default, help text,
flag group, the commands that take it, and its check. Everything else is derived from it:

* ``elasticdl train|evaluate|predict`` flags are generated from the fields
  (:func:`add_job_flags`), with the same names and defaults as the original ElasticDL;
* ``elasticdl.api.train(spec)`` or ``api.train(job_name=..., ...)`` builds it directly;
* the client validates it once (:meth:`JobSpec.resolve`) and hands it to the master as JSON
  (one argument or one file);
* the master derives the PS and worker specs from it (``elasticdl.common.replica_spec``).

Standard library only: the light client imports this to print ``--help``.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import os
import re
from typing import Any, Callable, Iterable, Mapping

from elasticdl.common import spec_codec
from elasticdl.common.job_dir import (  # noqa: F401 (part of this module's names)
    CHECKPOINT_SUBDIR,
    default_job_dir,
    elasticdl_home,
    jobs_root,
)
from elasticdl.common.spec_codec import SpecError, parse_bool
from elasticdl.common.types import JobType, PlatformName, Strategy

TRAIN, EVALUATE, PREDICT = "train", "evaluate", "predict"
JOB_COMMANDS = (TRAIN, EVALUATE, PREDICT)
# What each command does, for the job type of a spec built from it (train: see job_type()).
_COMMAND_JOB_TYPE = {EVALUATE: JobType.EVALUATION_ONLY, PREDICT: JobType.PREDICTION_ONLY}

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
IMAGE_PULL_POLICIES = ("Never", "IfNotPresent", "Always")
RESTART_POLICIES = ("Never", "OnFailure", "Always")
# --pod_security (elasticdl.k8s.security): the restricted securityContext, or the image's defaults.
POD_SECURITY_RESTRICTED, POD_SECURITY_NONE = "restricted", "none"
POD_SECURITY_MODES = (POD_SECURITY_RESTRICTED, POD_SECURITY_NONE)
AUX_PARAMS = ("disable_relaunch",)
DEFAULT_MASTER_PORT = 50001
DEFAULT_EXTRA_PYPI_INDEX = "https://pypi.org/simple"

# Replica names are "elasticdl-<job>-worker-<id>" (pods, services, log files). A DNS-1123
# label has at most 63 characters; keep room for the prefix and a 5-digit replica id.
MAX_JOB_NAME_LENGTH = 63 - len("elasticdl-") - len("-worker-99999")  # 40
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_MODEL_DEF = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# --------------------------------------------------------------------------------------------
# Field checks: each raises SpecError naming the flag and the fix
# --------------------------------------------------------------------------------------------


def _positive(name: str, value: int) -> None:
    if value <= 0:
        raise SpecError(f"--{name} must be > 0, got {value}")


def _non_negative(name: str, value: int) -> None:
    if value < 0:
        raise SpecError(f"--{name} must be >= 0, got {value}")


def _one_of(choices: tuple[str, ...]) -> Callable[[str, str], None]:
    def check(name: str, value: str) -> None:
        if value not in choices:
            raise SpecError(f"--{name} {value!r} is invalid; use one of {', '.join(choices)}")

    return check


def _port(name: str, value: int) -> None:
    if not 0 <= value < 65536:
        raise SpecError(f"--{name} must be in [0, 65535], got {value}")


def _job_name(name: str, value: str) -> None:
    if not value:
        raise SpecError("--job_name is required; e.g. --job_name=mnist-train")
    if len(value) > MAX_JOB_NAME_LENGTH:
        raise SpecError(
            f"--job_name {value!r} is {len(value)} characters; use at most {MAX_JOB_NAME_LENGTH} "
            "(it becomes part of Kubernetes pod names)"
        )
    if not _DNS1123_LABEL.match(value):
        suggestion = re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-") or "my-job"
        raise SpecError(
            f"--job_name {value!r} is invalid: use lowercase letters, digits and '-', starting and "
            f"ending with a letter or digit (e.g. {suggestion!r})"
        )


# Docker's image reference: [host[:port]/]path[:tag][@sha256:digest], path components lowercase.
_IMAGE_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?{_IMAGE_PATH}(?:/{_IMAGE_PATH})*"
    r"(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)


def _image(name: str, value: str) -> None:
    if value and not _IMAGE.match(value):
        raise SpecError(
            f"--{name} {value!r} is not an image name; use e.g. registry.example.com/team/model:v1 "
            "(lowercase, no spaces)"
        )


def _image_prefix(name: str, value: str) -> None:
    if value and not _IMAGE.match(image_in_prefix(value, "elasticdl:tag")):
        raise SpecError(
            f"--{name} {value!r} is not a registry prefix; use e.g. registry.example.com/team/ "
            "(the image becomes <prefix>elasticdl:<tag>)"
        )


def image_in_prefix(prefix: str, name: str) -> str:
    """``--docker_image_prefix`` + an image name: ``reg.example.com/team/`` or
    ``reg.example.com/team`` + ``elasticdl:t`` -> ``reg.example.com/team/elasticdl:t``."""
    return f"{prefix.rstrip('/')}/{name}" if prefix else name


def _namespace(name: str, value: str) -> None:
    if not _DNS1123_LABEL.match(value or "") or len(value) > 63:
        raise SpecError(
            f"--{name} {value!r} is not a Kubernetes namespace name: use lowercase letters, "
            "digits and '-' (at most 63)"
        )


def _model_def(name: str, value: str) -> None:
    if value and not _MODEL_DEF.match(value):
        raise SpecError(
            f"--model_def {value!r} is not a dotted path 'package.module.function' "
            "(e.g. mnist.mnist_functional_api.custom_model)"
        )


def _resource(name: str, value: str) -> None:
    from elasticdl.k8s import resources as k8s_resource

    if value:
        try:
            k8s_resource.parse_resource(value)
        except ValueError as e:
            raise SpecError(f"--{name}: {e}") from None


def _volume(name: str, value: str) -> None:
    from elasticdl.k8s import volumes as k8s_volume

    if value:
        try:
            k8s_volume.parse_volumes(value)
        except ValueError as e:
            raise SpecError(f"--{name}: {e}") from None


def _envs(name: str, value: str) -> None:
    parse_envs(value)


def _secret_envs(name: str, value: str) -> None:
    parse_secret_envs(value)


def _pull_secrets(name: str, value: str) -> None:
    parse_pull_secrets(value, f"--{name}")


def _env_patterns(name: str, value: str) -> None:
    for pattern in env_name_patterns(value):
        try:
            re.compile(pattern)
        except re.error as e:
            raise SpecError(f"--{name}: {pattern!r} is not a valid regex ({e})") from None


def _aux_params(name: str, value: str) -> None:
    unknown = sorted(aux_param_set(value) - set(AUX_PARAMS))
    if unknown:
        raise SpecError(f"--{name}: unknown {', '.join(unknown)}; known: {', '.join(AUX_PARAMS)}")


def _params(name: str, value: str) -> None:
    for item in (value or "").split(";"):
        key = item.split("=", 1)[0].strip()
        if item.strip() and ("=" not in item or not key):
            raise SpecError(f"--{name}: {item.strip()!r} is not key=value; use 'k1=v1; k2=v2'")


def _worker_priority(name: str, value: str) -> None:
    if not value or value in ("high", "low"):
        return
    try:
        fraction = float(value)
    except ValueError:
        fraction = -1.0
    if not 0.0 <= fraction <= 1.0:
        raise SpecError(
            f"--{name} {value!r} is invalid; use 'high', 'low' or a fraction in [0, 1] like 0.5"
        )


# --------------------------------------------------------------------------------------------
# The spec
# --------------------------------------------------------------------------------------------

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
        check = _one_of(choices)
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
        check=_model_def,
    )
    minibatch_size: int = _field(64, "Records per minibatch", "model", check=_positive)
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
        check=_params,
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
        check=_params,
    )
    log_level: str = _field("INFO", "Log level of every replica", "model", choices=LOG_LEVELS)
    get_model_steps: int = _field(
        1,
        "Pull the model from the PS every this many steps (forced to 1 for synchronous SGD)",
        "model",
        check=_positive,
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
        choices=("auto", "gloo", "nccl"),
    )
    checkpoint_steps: int = _field(
        0, "Checkpoint every N model versions (0: off)", "model", check=_non_negative
    )
    checkpoint_dir: str = _field("", "Directory for checkpoints", "model")
    keep_checkpoint_max: int = _field(
        0, "Checkpoints to keep (0: keep all)", "model", check=_non_negative
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
        8, "Minibatches per task (data shard)", "data", check=_positive
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
        check=_non_negative,
    )
    evaluation_steps: int = _field(
        0,
        "Evaluate every N model versions (0: only at the end)",
        "training",
        commands=(TRAIN,),
        check=_non_negative,
    )
    evaluation_start_delay_secs: int = _field(
        100,
        "Time-based evaluation: the first one not before this many seconds after the job starts",
        "training",
        commands=(TRAIN,),
        check=_non_negative,
    )
    evaluation_throttle_secs: int = _field(
        0,
        "Time-based evaluation: evaluate the newest model at most once every this many seconds "
        "(0: off)",
        "training",
        commands=(TRAIN,),
        check=_non_negative,
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
        check=_non_negative,
    )
    use_async: bool = _field(False, "Asynchronous SGD", "training", commands=(TRAIN,))
    grads_to_wait: int = _field(
        1,
        "Gradients the PS waits for (sync SGD)",
        "training",
        commands=(TRAIN,),
        check=_positive,
    )
    sync_version_tolerance: int = _field(
        0,
        "Staleness tolerated in sync SGD",
        "training",
        commands=(TRAIN,),
        check=_non_negative,
    )
    lr_staleness_modulation: bool = _field(
        False, "Scale the learning rate by gradient staleness", "training", commands=(TRAIN,)
    )
    relaunch_on_worker_failure: int = _field(
        1,
        "Relaunches allowed per failed worker",
        "training",
        commands=(TRAIN,),
        check=_non_negative,
    )
    relaunch_timeout_worker: bool = _field(
        False, "Relaunch workers whose tasks time out", "training", commands=(TRAIN,)
    )
    task_timeout: int = _field(
        300,
        "Seconds a task may run before the master takes it back for another worker (or 3x the "
        "longest task so far, if longer)",
        "training",
        check=_positive,
    )

    # ---- job ---------------------------------------------------------------------------
    job_name: str = _field(
        "",
        f"Unique job name: lowercase letters, digits and '-', at most {MAX_JOB_NAME_LENGTH} characters",
        "job",
        check=_job_name,
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
    num_workers: int = _field(2, "Number of workers", "job", check=_positive)
    num_ps_pods: int = _field(
        0,
        "Number of parameter servers (0 with ParameterServerStrategy means 1)",
        "job",
        check=_non_negative,
    )
    envs: str = _field(
        "", "Environment of master, workers and PS: 'k1=v1,k2=v2'", "job", check=_envs
    )
    secret_envs: str = _field(
        "",
        "Kubernetes: environment of master, workers and PS read from Secrets of the namespace, "
        "'NAME=secret/key,...'; the kubelet reads the values, which appear in no argv, job spec "
        "or pod spec",
        "job",
        check=_secret_envs,
    )
    populate_env_names: str = _field(
        "",
        "Names or regexes (comma-separated) of master environment variables copied to workers and PS",
        "job",
        check=_env_patterns,
    )
    aux_params: str = _field("", "Auxiliary parameters: disable_relaunch", "job", check=_aux_params)
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
    port: int = _field(DEFAULT_MASTER_PORT, "Master gRPC port", "job", commands=(), check=_port)

    # ---- kubernetes --------------------------------------------------------------------
    image_name: str = _field("", "Docker image of the job (Kubernetes)", "kubernetes", check=_image)
    image_base: str = _field(
        "",
        "Kubernetes: build the job's image on this base image from the local --model_zoo at "
        "submit time (pushed with --docker_image_prefix); with an --model_zoo path that exists "
        "only in the image (e.g. /model_zoo), run this pre-built image as it is",
        "kubernetes",
        check=_image,
    )
    docker_image_prefix: str = _field(
        "",
        "Registry prefix the image built from --image_base is pushed to as "
        "<prefix>elasticdl:<content tag> (default: built but not pushed, for a one-node cluster "
        "whose engine builds it)",
        "kubernetes",
        check=_image_prefix,
    )
    worker_image: str = _field(
        "", "Image of workers and PS (default: --image_name)", "kubernetes", check=_image
    )
    namespace: str = _field("default", "Kubernetes namespace", "kubernetes", check=_namespace)
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
        check=_resource,
    )
    master_resource_limit: str = _field(
        "", "Master resource limit (default: the request)", "kubernetes", check=_resource
    )
    worker_resource_request: str = _field(
        "cpu=1,memory=4096Mi",
        "Worker resources, e.g. cpu=1,memory=4096Mi,gpu=1",
        "kubernetes",
        check=_resource,
    )
    worker_resource_limit: str = _field(
        "", "Worker resource limit (default: the request)", "kubernetes", check=_resource
    )
    ps_resource_request: str = _field(
        "cpu=1,memory=4096Mi", "PS resources", "kubernetes", check=_resource
    )
    ps_resource_limit: str = _field(
        "", "PS resource limit (default: the request)", "kubernetes", check=_resource
    )
    master_pod_priority: str = _field("", "PriorityClass of the master pod", "kubernetes")
    worker_pod_priority: str = _field(
        "",
        "Worker priority: high, low, or a fraction like 0.5 (that share of the workers is high)",
        "kubernetes",
        check=_worker_priority,
    )
    ps_pod_priority: str = _field("", "PriorityClass of the PS pods", "kubernetes")
    volume: str = _field(
        "",
        "Volumes: 'claim_name=c1,mount_path=/p;host_path=/h,mount_path=/q[,type=Directory][,sub_path=s]'"
        " or a Secret's keys as files: 'secret_name=s,mount_path=/etc/tls'",
        "kubernetes",
        check=_volume,
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
        check=_pull_secrets,
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
        spec_codec.check_types(self)
        for f in dataclasses.fields(self):
            check = f.metadata["check"]
            if check is not None:
                check(f.name, getattr(self, f.name))

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
        return spec_codec.from_dict(cls, dict(data), "job spec")

    @classmethod
    def from_json(cls, text: str) -> "JobSpec":
        return spec_codec.from_json(cls, text, "job spec")

    # ---- the whole job -----------------------------------------------------------------
    def resolve(self, check_local_paths: bool | None = None) -> tuple["JobSpec", list[str]]:
        """Fill the derived defaults and check the fields against each other. Returns the
        resolved spec and notices for the user about what was decided. Resolving a resolved
        spec changes nothing (the master resolves what the client sent)."""
        spec, notices = self._with_derived_defaults()
        spec._check_together(check_local_paths)
        return spec, notices

    def _with_derived_defaults(self) -> tuple["JobSpec", list[str]]:
        notices: list[str] = []
        changes: dict[str, Any] = {}
        platform = self.platform
        if platform is None:
            image_flag = (
                "--image_name" if self.image_name else "--image_base" if self.image_base else ""
            )
            platform = PlatformName.KUBERNETES if image_flag else PlatformName.LOCAL
            reason = f"{image_flag} is set" if image_flag else "no --image_name given"
            notices.append(f"platform: {platform} ({reason}; override with --platform)")
            changes["platform"] = platform
        if (
            self.image_base
            and not (self.image_name or self.docker_image_prefix)
            and prebuilt_model_zoo(self.model_zoo)
        ):
            # The seed's pre-built form: the zoo is a path inside the image, nothing to build.
            changes.update(image_name=self.image_base, image_base="")
            notices.append(
                f"image: {self.image_base} as it is (--model_zoo={self.model_zoo} is not on this "
                "machine: the pre-built image holds it)"
            )
        if self.job_type is None:
            changes["job_type"] = infer_job_type(self)
        if platform == PlatformName.LOCAL:
            changes.update(_absolute_local_paths(self))
            if not self.job_dir:
                changes["job_dir"] = default_job_dir(self.job_name)
        if not self.allreduce and self.num_ps_pods == 0:
            changes["num_ps_pods"] = 1
            notices.append(
                "num_ps_pods: 1 (ParameterServerStrategy needs a parameter server; "
                "set --num_ps_pods to change)"
            )
        if self.checkpoint_steps > 0 and not self.checkpoint_dir:
            job_dir = changes.get("job_dir", self.job_dir)
            checkpoint_dir, notice = default_checkpoint_dir(platform, job_dir)
            changes["checkpoint_dir"] = checkpoint_dir
            notices.append(notice)
        spec = dataclasses.replace(self, **changes) if changes else self
        return spec, notices

    def _check_together(self, check_local_paths: bool | None) -> None:
        if check_local_paths is None:
            check_local_paths = self.platform == PlatformName.LOCAL
        self._check_image_flags(check_local_paths)
        if self.allreduce and self.num_ps_pods:
            raise SpecError(
                f"--num_ps_pods={self.num_ps_pods} with AllreduceStrategy: workers allreduce "
                "gradients among themselves; drop --num_ps_pods (or set it to 0)"
            )
        if not self.model_def:
            raise SpecError(
                "--model_def is required, e.g. --model_def=mnist.mnist_functional_api.custom_model"
            )
        _check_tls(self, check_local_paths)
        if check_local_paths:
            _check_model_zoo(self.model_zoo, self.model_def)
        job_type = self.job_type or infer_job_type(self)
        if job_type == JobType.PREDICTION_ONLY:
            if self.training_data or self.validation_data:
                raise SpecError(
                    "--prediction_data cannot be combined with --training_data or "
                    "--validation_data; run separate jobs"
                )
            if not self.prediction_data:
                raise SpecError("--prediction_data is required to predict")
            if not self.checkpoint_dir_for_init:
                raise SpecError(
                    "--checkpoint_dir_for_init is required to predict (the trained model's checkpoint)"
                )
        elif job_type == JobType.EVALUATION_ONLY:
            if not self.validation_data:
                raise SpecError("--validation_data is required to evaluate")
            if not self.checkpoint_dir_for_init:
                raise SpecError(
                    "--checkpoint_dir_for_init is required to evaluate (the model's checkpoint)"
                )
        else:
            if not self.training_data:
                raise SpecError(
                    "--training_data is required to train, e.g. --training_data=/data/mnist/train"
                )
            if job_type == JobType.TRAINING_WITH_EVALUATION and not self.validation_data:
                raise SpecError(
                    "--validation_data is required for job type training_with_evaluation"
                )
            if self.evaluation_steps > 0 and not self.validation_data:
                raise SpecError(
                    "--evaluation_steps needs --validation_data (the data to evaluate on)"
                )
            if self.evaluation_throttle_secs > 0 and not self.validation_data:
                raise SpecError(
                    "--evaluation_throttle_secs needs --validation_data (the data to evaluate on)"
                )
        if check_local_paths:
            for name in (
                "training_data",
                "validation_data",
                "prediction_data",
                "checkpoint_dir_for_init",
            ):
                value = getattr(self, name)
                if (
                    value
                    and _looks_like_local_path(value)
                    and not os.path.exists(os.path.expanduser(value))
                ):
                    raise SpecError(
                        f"--{name} {value!r} does not exist on this machine; check the path"
                    )
        for kind in ("master", "worker", "ps"):
            request = getattr(self, f"{kind}_resource_request")
            limit = getattr(self, f"{kind}_resource_limit")
            if request and limit:
                from elasticdl.k8s import resources as k8s_resource

                try:
                    k8s_resource.check_limit_not_below_request(request, limit)
                except ValueError as e:
                    raise SpecError(f"--{kind}_resource_limit: {e}") from None
        if check_local_paths and self.output:
            output = os.path.expanduser(self.output)
            if os.path.exists(output) and not os.path.isdir(output):
                raise SpecError(
                    f"--output {self.output!r} is a file; give a directory (the model or the "
                    "predictions are written into it)"
                )
        if self.tensorboard_log_dir:
            self._check_tensorboard_log_dir(check_local_paths)
        if check_local_paths and self.log_file_path:
            parent = os.path.dirname(os.path.abspath(os.path.expanduser(self.log_file_path)))
            if not os.path.isdir(parent):
                raise SpecError(
                    f"--log_file_path {self.log_file_path!r}: directory {parent} does not exist; "
                    "create it or choose another file"
                )
        if (
            check_local_paths
            and self.cluster_spec
            and not os.path.isfile(os.path.expanduser(self.cluster_spec))
        ):
            raise SpecError(f"--cluster_spec {self.cluster_spec!r} is not a file; check the path")
        if self.secret_envs:
            if self.platform == PlatformName.LOCAL:
                raise SpecError(
                    "--secret_envs reads Kubernetes Secrets, which the local platform has none "
                    "of; export the variables in the shell that runs elasticdl (local replicas "
                    "inherit its environment) and drop --secret_envs"
                )
            both = sorted(set(self.secret_env_refs()) & set(self.env_vars()))
            if both:
                raise SpecError(
                    f"{', '.join(both)} is set by both --envs and --secret_envs; keep one"
                )
        if self.cluster_spec and self.cluster_spec_json:
            raise SpecError("--cluster_spec and --cluster_spec_json are exclusive; pass only one")

    def _check_image_flags(self, check_local_paths: bool) -> None:
        if self.docker_image_prefix and not self.image_base:
            raise SpecError(
                "--docker_image_prefix needs --image_base (the base image the model zoo is built "
                "on); with a built image, pass --image_name alone"
            )
        if self.image_base and self.image_name:
            raise SpecError(
                "--image_base and --image_name are exclusive: --image_name runs a built image, "
                "--image_base builds one from --model_zoo (or runs it with an in-image "
                "--model_zoo); pass only one"
            )
        if self.image_base:
            if self.platform != PlatformName.KUBERNETES:
                raise SpecError(
                    f"--image_base builds an image for Kubernetes, not for --platform="
                    f"{self.platform}; drop --image_base (local jobs use --model_zoo directly)"
                )
            if self.docker_image_prefix and prebuilt_model_zoo(self.model_zoo):
                raise SpecError(
                    f"--docker_image_prefix: nothing to build or push, --model_zoo="
                    f"{self.model_zoo} is not on this machine (a pre-built --image_base holds "
                    "it); drop --docker_image_prefix, or point --model_zoo at a local directory "
                    "to build"
                )
            # Still set after resolving: the build form, which needs the zoo on this machine.
            zoo = os.path.expanduser(self.model_zoo or ".")
            if not os.path.isdir(zoo):
                raise SpecError(
                    f"--model_zoo {self.model_zoo!r} is not a directory on this machine: give the "
                    "model zoo to build into the image, or an absolute path inside a pre-built "
                    "--image_base (e.g. --model_zoo=/model_zoo)"
                )
            _check_model_zoo(zoo, self.model_def)
            if self.cluster_spec and not os.path.isfile(os.path.expanduser(self.cluster_spec)):
                raise SpecError(
                    f"--cluster_spec {self.cluster_spec!r} is not a file; check the path (it is "
                    "copied into the image)"
                )
        elif self.platform == PlatformName.KUBERNETES and not self.image_name:
            raise SpecError(
                "--image_name is required on Kubernetes; build one with 'elasticdl zoo build' "
                "(or pass --image_base to build it at submit time)"
            )

    def _check_tensorboard_log_dir(self, check_local_paths: bool) -> None:
        """The master writes there: locally a directory it can create or write; on
        Kubernetes one under a --volume mount of the master pod (anything else is lost with
        the pod)."""
        value = self.tensorboard_log_dir
        if "://" in value:
            return  # a remote filesystem the event writer knows (e.g. s3://, gs://)
        if self.platform == PlatformName.KUBERNETES:
            from elasticdl.k8s import volumes as k8s_volume

            mounts = [v.mount_path.rstrip("/") for v in k8s_volume.parse_volumes(self.volume)]
            path = os.path.normpath(value)
            if not os.path.isabs(value) or not any(
                path == m or path.startswith(m + "/") for m in mounts
            ):
                raise SpecError(
                    f"--tensorboard_log_dir {value!r} is not under a --volume mount_path "
                    f"({', '.join(mounts) or 'none given'}); the master pod would lose what it "
                    "writes there: mount a volume and give a directory inside it"
                )
            return
        if not check_local_paths:
            return
        path = os.path.abspath(os.path.expanduser(value))
        if os.path.exists(path) and not os.path.isdir(path):
            raise SpecError(
                f"--tensorboard_log_dir {value!r} is a file; give a directory (the event files "
                "are written into it)"
            )
        existing = path
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
            raise SpecError(
                f"--tensorboard_log_dir {value!r}: {existing} is not a writable directory; "
                "choose a directory you can write"
            )


FIELDS = {f.name: f for f in dataclasses.fields(JobSpec)}


def infer_job_type(spec: JobSpec) -> JobType:
    if spec.job_type is not None:
        return spec.job_type
    if spec.prediction_data:
        return JobType.PREDICTION_ONLY
    if spec.training_data:
        if spec.validation_data:
            return JobType.TRAINING_WITH_EVALUATION
        return JobType.TRAINING_ONLY
    if spec.validation_data:
        return JobType.EVALUATION_ONLY
    return JobType.TRAINING_ONLY


# --------------------------------------------------------------------------------------------
# Values inside string fields
# --------------------------------------------------------------------------------------------


def parse_envs(envs: str) -> dict[str, str]:
    """``"k1=v1,k2=v2"`` -> dict. A piece without '=' belongs to the previous value, so
    ``"A=x,y,B=z"`` gives ``{"A": "x,y", "B": "z"}``."""
    result: dict[str, str] = {}
    last = None
    for piece in envs.split(",") if envs else ():
        if not piece.strip() and last is None:
            continue
        if "=" in piece:
            key, value = piece.split("=", 1)
            key = key.strip()
            if not _ENV_NAME.match(key):
                raise SpecError(
                    f"--envs: {key!r} is not a valid environment variable name; use 'NAME=value,...'"
                )
            if any(ord(c) < 32 or ord(c) == 127 for c in value):
                raise SpecError(
                    f"--envs: the value of {key} contains control characters (e.g. a newline); "
                    "remove them"
                )
            if value.startswith(_SECRET_REF_PREFIX):
                raise SpecError(
                    f"--envs: {key}={_SECRET_REF_PREFIX}... would reach the pods as plain text; "
                    f"use --secret_envs={key}=<secret>/<key>"
                )
            result[key] = value
            last = key
        elif last is not None:
            result[last] += "," + piece
        else:
            raise SpecError(f"--envs: {piece!r} has no '='; use 'NAME=value,NAME2=value2'")
    return result


_SECRET_REF_PREFIX = "secretKeyRef:"
# A Secret's name (DNS-1123 subdomain) and a key of its data.
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


def parse_pull_secrets(value: str, flag: str = "--image_pull_secrets") -> list[str]:
    """``"regcred,other"`` -> ["regcred", "other"]; an empty item, a name that is not a
    Secret's or one given twice raises :class:`SpecError` naming ``flag``."""
    if not (value or "").strip():
        return []
    names: list[str] = []
    for piece in value.split(","):
        name = piece.strip()
        if not name:
            raise SpecError(
                f"{flag} {value!r} has an empty Secret name; give NAME[,NAME...] "
                "(e.g. regcred, a Secret of type kubernetes.io/dockerconfigjson)"
            )
        if len(name) > 253 or not _SECRET_NAME.match(name):
            raise SpecError(
                f"{flag}: {name!r} is not a Secret name: use lowercase letters, digits, '-' "
                "and '.'"
            )
        if name in names:
            raise SpecError(f"{flag}: {name} is given twice; keep one")
        names.append(name)
    return names


def parse_secret_envs(value: str) -> dict[str, tuple[str, str]]:
    """``"NAME=secret/key,NAME2=secret2/key2"`` -> {NAME: (secret, key)}."""
    refs: dict[str, tuple[str, str]] = {}
    for piece in (value or "").split(","):
        piece = piece.strip()
        if not piece:
            continue
        name, _, ref = piece.partition("=")
        name = name.strip()
        secret, _, key = ref.strip().partition("/")
        if not _ENV_NAME.match(name) or not secret or not key:
            raise SpecError(
                f"--secret_envs: {piece!r} is not NAME=<secret>/<key>; e.g. "
                "--secret_envs=AWS_SECRET_ACCESS_KEY=s3-credentials/secret-key"
            )
        if len(secret) > 253 or not _SECRET_NAME.match(secret):
            raise SpecError(
                f"--secret_envs: {secret!r} (for {name}) is not a Secret name: use lowercase "
                "letters, digits, '-' and '.'"
            )
        if len(key) > 253 or not _SECRET_KEY.match(key) or key in (".", ".."):
            raise SpecError(
                f"--secret_envs: {key!r} (for {name}) is not a Secret key: use letters, digits, "
                "'-', '_' and '.'"
            )
        if name in refs:
            raise SpecError(f"--secret_envs: {name} is given twice; keep one")
        refs[name] = (secret, key)
    return refs


def env_name_patterns(value: str) -> list[str]:
    return [p.strip() for p in (value or "").split(",") if p.strip()]


def aux_param_set(value: str) -> set[str]:
    return {p.strip() for p in (value or "").replace(";", ",").split(",") if p.strip()}


# --------------------------------------------------------------------------------------------
# Local paths
# --------------------------------------------------------------------------------------------


# Paths on this machine; on the local platform they are made absolute so the job does not
# depend on the directory its master starts in. Inputs only when they exist (they may also be
# table names or URLs); outputs always.
_LOCAL_INPUTS = (
    "training_data",
    "validation_data",
    "prediction_data",
    "checkpoint_dir_for_init",
    "tls_cert_file",
    "tls_key_file",
    "tls_ca_file",
)
_LOCAL_OUTPUTS = (
    "model_zoo",
    "checkpoint_dir",
    "output",
    "log_file_path",
    "tensorboard_log_dir",
    "cluster_spec",
    "job_dir",
)


def _absolute_local_paths(spec: JobSpec) -> dict[str, str]:
    changes = {}
    for name in _LOCAL_INPUTS + _LOCAL_OUTPUTS:
        value = getattr(spec, name)
        if not value or "://" in value:
            continue
        expanded = os.path.expanduser(value)
        if name in _LOCAL_OUTPUTS or os.path.exists(expanded):
            absolute = os.path.abspath(expanded)
            if absolute != value:
                changes[name] = absolute
    return changes


def prebuilt_model_zoo(model_zoo: str) -> bool:
    """``--image_base`` with this ``--model_zoo`` runs the image as it is: an absolute path
    that does not exist here names the zoo inside the image (the seed's ``/model_zoo``)."""
    return bool(model_zoo) and os.path.isabs(model_zoo) and not os.path.exists(model_zoo)


# Where --checkpoint_steps writes without --checkpoint_dir (the original wrote into
# "checkpoint_dir" under the master's working directory). Pods: under /tmp, the one directory
# the restricted pods may write; nothing keeps it once the pod is gone.
POD_CHECKPOINT_DIR = "/tmp/elasticdl/" + CHECKPOINT_SUBDIR


def default_checkpoint_dir(platform: PlatformName | None, job_dir: str) -> tuple[str, str]:
    """The checkpoint directory of ``--checkpoint_steps`` without ``--checkpoint_dir`` and the
    one-line notice that says where it is."""
    why = "--checkpoint_steps without --checkpoint_dir"
    if platform == PlatformName.LOCAL:
        path = os.path.join(job_dir, CHECKPOINT_SUBDIR)
        return path, f"checkpoint_dir: {path} ({why})"
    if job_dir:  # a restartable master's --job_dir lies on a volume (k8s_backend.check_job_dir)
        path = os.path.join(job_dir, CHECKPOINT_SUBDIR)
        return path, f"checkpoint_dir: {path} ({why}; under --job_dir, on its volume)"
    return POD_CHECKPOINT_DIR, (
        f"checkpoint_dir: {POD_CHECKPOINT_DIR} in the PS pods ({why}); it is on no volume, so "
        "the checkpoints are lost with the pods: pass --checkpoint_dir under a --volume "
        "mount_path to keep them"
    )


def _check_tls(spec: "JobSpec", check_local_paths: bool) -> None:
    """All three TLS files or none; readable PEM where the job runs on this machine (in pods
    they come from a Secret volume: elasticdl.common.tls)."""
    from elasticdl.common import tls

    try:
        if check_local_paths:
            tls.TLS.of(spec)
        else:
            tls.check_flags(
                spec.tls_cert_file, spec.tls_key_file, spec.tls_ca_file, spec.tls_server_name
            )
    except tls.TLSError as e:
        raise SpecError(str(e)) from None


def _looks_like_local_path(value: str) -> bool:
    # Data sources may also be table names ("project.table") or URLs; only check what is
    # clearly a filesystem path.
    return "://" not in value and (os.sep in value or value.startswith((".", "~")))


def check_model_zoo(model_zoo: str, model_def: str) -> None:
    """``model_def``'s file is in the directory ``model_zoo`` and compiles."""
    _check_model_zoo(model_zoo, model_def)


def _check_model_zoo(model_zoo: str, model_def: str) -> None:
    zoo = os.path.expanduser(model_zoo or ".")
    if not os.path.isdir(zoo):
        raise SpecError(f"--model_zoo {model_zoo!r} is not a directory; point it at your model zoo")
    module_path = model_def.rsplit(".", 1)[0].replace(".", os.sep)
    candidates = [
        os.path.join(zoo, module_path + ".py"),
        os.path.join(zoo, module_path, "__init__.py"),
    ]
    found = [c for c in candidates if os.path.isfile(c)]
    if not found:
        where = "--model_zoo" if model_zoo else "the current directory (set --model_zoo)"
        raise SpecError(
            f"--model_def {model_def!r}: no file {module_path}.py under {where} ({os.path.abspath(zoo)})"
        )
    _check_model_syntax(model_def, found[0])


def _check_model_syntax(model_def: str, path: str) -> None:
    """A model file that cannot compile fails here, in the client, instead of in the master
    after submission. Compiling runs none of its code (imports are the master's to check)."""
    try:
        with open(path, "rb") as f:
            compile(f.read(), path, "exec", dont_inherit=True)
    except SyntaxError as e:
        raise SpecError(
            f"--model_def {model_def!r}: {path} line {e.lineno}: SyntaxError: "
            f"{' '.join(str(e.msg).split())}; fix the model file"
        ) from None
    except (OSError, ValueError) as e:  # unreadable, or NUL bytes (ValueError before 3.12)
        raise SpecError(f"--model_def {model_def!r}: cannot read {path} as Python: {e}") from None


# --------------------------------------------------------------------------------------------
# Flags that were removed
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RetiredFlag:
    """A flag of the original ElasticDL that selected a mode this one does not have. The value
    that means what every job here does is still accepted (tutorials pass it); any other value
    is an error that says why."""

    accepted: Any
    why: str


RETIRED_FLAGS = {
    "need_elasticdl_job_service": RetiredFlag(
        True,
        "jobs always run ElasticDL's task service; a custom --job_command without it is not supported",
    ),
    "need_task_manager": RetiredFlag(
        True, "the master's task manager is what shards the data; it cannot be turned off"
    ),
    "need_pod_manager": RetiredFlag(
        True, "the master's replica manager starts and relaunches replicas; it cannot be turned off"
    ),
    "task_fault_tolerance": RetiredFlag(
        True,
        "the tasks of a failed worker are always re-queued (that is how every record is trained "
        "exactly once); use --relaunch_on_worker_failure=0 to not relaunch workers",
    ),
    "need_tf_config": RetiredFlag(
        False, "TF_CONFIG served --job_command jobs, which are not supported"
    ),
    "job_command": RetiredFlag(
        "", "custom worker commands are not supported; train a model-zoo model with --model_def"
    ),
}


def check_retired(name: str, value: Any) -> None:
    retired = RETIRED_FLAGS[name]
    if isinstance(retired.accepted, bool):
        try:
            value = parse_bool(value)
        except ValueError as e:
            raise SpecError(f"--{name}: {e}") from None
    if value != retired.accepted:
        raise SpecError(
            f"--{name}={spec_codec.to_text(value)} was removed: {retired.why} "
            f"(drop the flag or pass --{name}={spec_codec.to_text(retired.accepted)})"
        )


# --------------------------------------------------------------------------------------------
# Building a spec from flags or keyword arguments
# --------------------------------------------------------------------------------------------


def command_fields(command: str) -> list[dataclasses.Field]:
    if command not in JOB_COMMANDS:
        raise SpecError(f"unknown job command {command!r}; use one of {', '.join(JOB_COMMANDS)}")
    return [f for f in dataclasses.fields(JobSpec) if command in f.metadata["commands"]]


_GROUP_TITLES = {
    "model": "model",
    "data": "data",
    "training": "training",
    "predict": "prediction",
    "job": "job",
    "kubernetes": "Kubernetes",
}


def add_job_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """Add the flags of ``command`` to ``parser``, generated from the spec's fields.

    Flags a user does not give are absent from the parsed namespace (argparse.SUPPRESS), so
    :func:`given_values` knows exactly what was typed; defaults live in the spec alone.
    """
    groups: dict[str, argparse._ArgumentGroup] = {}
    aliases = {"image_name": ["--image"]}  # seed 000's spelling (the client design doc)
    ftypes = spec_codec.field_types(JobSpec)
    for f in command_fields(command):
        group = f.metadata["group"]
        if group not in groups:
            groups[group] = parser.add_argument_group(_GROUP_TITLES[group])
        g = groups[group]
        ftype = ftypes[f.name]
        help_text = f.metadata["help"]
        if ftype.base is bool:
            g.add_argument(
                f"--{f.name}",
                nargs="?",
                const=spec_codec.to_text(not f.default),
                default=argparse.SUPPRESS,
                metavar="BOOL",
                help=f"{help_text} (default: {spec_codec.to_text(f.default)}; "
                f"'--{f.name}' alone means {spec_codec.to_text(not f.default)})",
            )
            continue
        choices = f.metadata["choices"] or (
            tuple(m.value for m in ftype.base) if issubclass(ftype.base, enum.Enum) else ()
        )
        default = spec_codec.to_text(f.default)
        suffix = (
            " (required)"
            if f.metadata["required"]
            else (f" (default: {default})" if default else "")
        )
        g.add_argument(
            f"--{f.name}",
            *aliases.get(f.name, []),
            default=argparse.SUPPRESS,
            metavar=f.name.upper() if not choices else "{" + ",".join(choices) + "}",
            help=help_text + suffix,
        )
    for name in RETIRED_FLAGS:
        if command == TRAIN:
            parser.add_argument(
                f"--{name}",
                nargs="?",
                const="true",
                default=argparse.SUPPRESS,
                help=argparse.SUPPRESS,
            )


def given_values(namespace: argparse.Namespace | Mapping[str, Any]) -> dict[str, str]:
    """The job flags a user typed, as text: ``{"minibatch_size": "64", ...}``."""
    items = namespace.items() if isinstance(namespace, Mapping) else vars(namespace).items()
    return {k: v for k, v in items if k in FIELDS or k in RETIRED_FLAGS}


def spec_from_text(command: str, values: Mapping[str, str]) -> JobSpec:
    """A spec from flag text (the CLI): each value converted by its field's type."""
    ftypes = spec_codec.field_types(JobSpec)
    typed: dict[str, Any] = {}
    for name, text in values.items():
        if name in RETIRED_FLAGS:
            check_retired(name, text)
            continue
        typed[name] = spec_codec.from_text(name, text, ftypes[name])
    return spec_from_values(command, typed)


def spec_from_values(command: str, values: Mapping[str, Any]) -> JobSpec:
    """A spec from typed values (the API's keyword arguments)."""
    allowed = {f.name for f in command_fields(command)} | {"job_type", "port"}
    fields: dict[str, Any] = {}
    for name, value in values.items():
        if name in RETIRED_FLAGS:
            check_retired(name, value)
            continue
        if name not in FIELDS:
            raise SpecError(_unknown_field_message(name, command))
        if name not in allowed:
            raise SpecError(f"{name} is not a parameter of '{command}' jobs")
        fields[name] = value
    if "job_name" not in fields:
        raise SpecError("--job_name is required; e.g. --job_name=mnist-train")
    if command in _COMMAND_JOB_TYPE:
        fields.setdefault("job_type", _COMMAND_JOB_TYPE[command])
    return JobSpec(**fields)


def _unknown_field_message(name: str, command: str) -> str:
    import difflib

    close = difflib.get_close_matches(name, [f.name for f in command_fields(command)], n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"{name} is not a job parameter{hint}"


def spec_fields(command: str) -> Iterable[str]:
    return [f.name for f in command_fields(command)]


# --------------------------------------------------------------------------------------------
# The master's command line: the whole spec in one argument or one file
# --------------------------------------------------------------------------------------------


class _MasterArgvParser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise SpecError(message)


def master_argv(spec: JobSpec | None = None, spec_file: str = "") -> list[str]:
    """The master's arguments: ``--job_spec=JSON`` (only the fields that differ from their
    defaults, so a pod manifest stays readable) or ``--job_spec_file=PATH``."""
    if (spec is None) == (not spec_file):
        raise ValueError("give the master either a spec or a spec file")
    if spec_file:
        return [f"--job_spec_file={spec_file}"]
    return [f"--job_spec={spec.to_json(only_changed=True)}"]


def spec_from_master_argv(argv: list[str]) -> JobSpec:
    """Read what :func:`master_argv` wrote and resolve it (local paths are the client's to
    check). Raises :class:`SpecError` with a one-line message."""
    parser = _MasterArgvParser(prog="elasticdl master", allow_abbrev=False)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--job_spec", help="The job spec as JSON")
    source.add_argument("--job_spec_file", help="A file holding the job spec as JSON")
    args = parser.parse_args(argv)
    text = args.job_spec
    if args.job_spec_file:
        try:
            with open(args.job_spec_file) as f:
                text = f.read()
        except OSError as e:
            raise SpecError(
                f"--job_spec_file: cannot read {args.job_spec_file}: {e.strerror}"
            ) from None
    spec, _ = JobSpec.from_json(text).resolve(check_local_paths=False)
    return spec
