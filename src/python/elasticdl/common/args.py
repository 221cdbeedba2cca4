"""Every command-line flag of an ElasticDL job, defined once.

The client (``elasticdl train|evaluate|predict``) and the master (``python -m
elasticdl.master.main``) parse the *same* flags: the client validates them, re-serialises them
with :func:`build_arguments_from_parsed_result` and starts the master with that argv, which the
master reads back with :func:`parse_master_args`. Keeping one definition is what makes that
round trip lossless.

This module must stay light: the client imports it to print ``--help``, so it imports nothing
beyond the standard library (no TensorFlow, NumPy, gRPC or Kubernetes).

Differences from the original ElasticDL, on purpose:

* Unknown flags are errors (the original used ``parse_known_args`` and silently ignored typos
  like ``--num_worker=4``). Abbreviated flags are rejected too (``--job`` is not ``--job_name``).
* ``--distribution_strategy=ParameterServerStrategy`` with ``--num_ps_pods=0`` (both defaults)
  no longer switches the job to AllReduce behind the user's back: the job gets one PS and
  :func:`normalize_job_args` returns a notice saying so. The parser default of
  ``--num_ps_pods`` stays 0 ("not set") so a user who asks for more PS pods is never overridden.
* ``--platform`` (``local`` or ``kubernetes``) and ``--job_dir`` are new: jobs run as local
  processes unless an image is given. ``--kube_context`` is new (kubeconfig context).
* ``--need_elasticdl_job_service`` defaults to true (the original: false, so every model-zoo
  job had to pass ``--need_elasticdl_job_service=true`` or the master refused to start).
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Iterable, Sequence

# --------------------------------------------------------------------------------------------
# Constants shared by client and master
# --------------------------------------------------------------------------------------------

PLATFORM_LOCAL = "local"
PLATFORM_KUBERNETES = "kubernetes"
PLATFORMS = (PLATFORM_LOCAL, PLATFORM_KUBERNETES)

PS_STRATEGY = "ParameterServerStrategy"
ALLREDUCE_STRATEGY = "AllreduceStrategy"
DISTRIBUTION_STRATEGIES = (PS_STRATEGY, ALLREDUCE_STRATEGY)


class JobType:
    """What a job does; derived from the data flags when ``--job_type`` is not given."""

    TRAINING_ONLY = "training_only"
    TRAINING_WITH_EVALUATION = "training_with_evaluation"
    EVALUATION_ONLY = "evaluation_only"
    PREDICTION_ONLY = "prediction_only"
    ALL = (TRAINING_ONLY, TRAINING_WITH_EVALUATION, EVALUATION_ONLY, PREDICTION_ONLY)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
IMAGE_PULL_POLICIES = ("Never", "IfNotPresent", "Always")
RESTART_POLICIES = ("Never", "OnFailure", "Always")
DEFAULT_MASTER_PORT = 50001
DEFAULT_EXTRA_PYPI_INDEX = "https://pypi.org/simple"

# Replica names are "elasticdl-<job>-worker-<id>" (pods, services, log files). A DNS-1123
# label has at most 63 characters; keep room for the prefix and a 5-digit replica id.
_NAME_PREFIX = "elasticdl-"
_LONGEST_SUFFIX = "-worker-99999"
MAX_JOB_NAME_LENGTH = 63 - len(_NAME_PREFIX) - len(_LONGEST_SUFFIX)  # 40
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_MODEL_DEF = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")

_TRUE_STRINGS = ("true", "yes", "t", "y", "1")

# Keys of a parsed Namespace that only steer the client; they are never sent to the master.
CLIENT_ONLY_ARGS = frozenset({"func", "command", "detach", "output_format", "yaml", "_parser"})


class ArgumentError(ValueError):
    """A bad flag value. The message is one line naming the flag and the fix."""


# --------------------------------------------------------------------------------------------
# Parser plumbing
# --------------------------------------------------------------------------------------------


class StrictArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser that raises :class:`ArgumentError` instead of exiting.

    The CLI turns the exception into ``elasticdl: error: ...`` and exit status 2; the master
    and library users get an exception they can catch. Abbreviations are disabled so that a
    truncated flag is reported instead of silently matched.
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        if message.startswith("unrecognized arguments"):
            message = _explain_unknown_arguments(self, message)
        raise ArgumentError(f"{message} (see '{self.prog} --help')")

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        # parse_known_args + explicit rejection gives us one message for all unknown flags,
        # with "did you mean" hints, instead of argparse's bare list.
        namespace, extras = self.parse_known_args(args, namespace)
        # Sub-commands register themselves as `_parser` (see elasticdl.client.main) so the
        # message and the "did you mean" hints come from the sub-command that was used.
        target = getattr(namespace, "_parser", None) or self
        if hasattr(namespace, "_parser"):
            delattr(namespace, "_parser")
        if extras:
            target.error("unrecognized arguments: " + " ".join(extras))
        return namespace


def _explain_unknown_arguments(parser: argparse.ArgumentParser, message: str) -> str:
    import difflib  # only on errors: keeps `elasticdl --help` fast

    extras = message.split(":", 1)[1].split()
    known = [opt for action in parser._actions for opt in action.option_strings]
    hints = []
    for extra in extras:
        if not extra.startswith("-"):
            continue
        flag = extra.split("=", 1)[0]
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
        if close:
            hints.append(f"{flag} -> did you mean {close[0]}?")
    message = "unrecognized arguments: " + " ".join(extras)
    if hints:
        message += " (" + "; ".join(hints) + ")"
    return message


def parse_bool(value: str | bool) -> bool:
    """``true|yes|t|y|1`` (any case) is True, anything else False (original semantics)."""
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in _TRUE_STRINGS


def add_bool_param(parser, name: str, default: bool, help: str) -> None:
    """``--flag`` alone flips ``default``; ``--flag=VALUE`` sets it via :func:`parse_bool`."""
    parser.add_argument(
        name,
        type=parse_bool,
        nargs="?",
        const=not default,
        default=default,
        metavar="BOOL",
        help=f"{help} (default: {str(default).lower()}; '{name}' alone means {str(not default).lower()})",
    )


def pos_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    if number <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def non_neg_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value!r}")
    if number < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value!r}")
    return number


# --------------------------------------------------------------------------------------------
# Flag groups
# --------------------------------------------------------------------------------------------


def add_model_params(parser) -> None:
    """Flags the master forwards to workers: the model, its data and how it trains."""
    g = parser.add_argument_group("model")
    g.add_argument(
        "--minibatch_size", type=int, default=64, help="Records per minibatch (default: 64)"
    )
    g.add_argument(
        "--model_zoo",
        default="",
        help="Directory holding the model definitions (the root of --model_def's module path)",
    )
    g.add_argument(
        "--log_level",
        default="INFO",
        type=str.upper,
        choices=LOG_LEVELS,
        help="Log level of every replica",
    )
    g.add_argument(
        "--feed", default="feed", help="Name of the feed (dataset) function in the model file"
    )
    g.add_argument("--loss", default="loss", help="Name of the loss function in the model file")
    g.add_argument(
        "--optimizer", default="optimizer", help="Name of the optimizer function in the model file"
    )
    g.add_argument(
        "--callbacks", default="callbacks", help="Name of the callbacks function in the model file"
    )
    g.add_argument(
        "--eval_metrics_fn",
        default="eval_metrics_fn",
        help="Name of the evaluation-metrics function in the model file",
    )
    g.add_argument(
        "--custom_data_reader",
        default="custom_data_reader",
        help="Name of the optional custom data reader factory in the model file",
    )
    g.add_argument(
        "--model_def",
        default="",
        help="Model function as a dotted path below --model_zoo, e.g. mnist.mnist_functional_api.custom_model",
    )
    g.add_argument(
        "--get_model_steps",
        type=pos_int,
        default=1,
        help="Pull the model from the PS every this many steps (forced to 1 for synchronous SGD)",
    )
    g.add_argument(
        "--data_reader_params",
        default="",
        help='Data reader parameters "k1=v1; k2=v2", e.g. \'columns=["a","b"]; label_col="y"\'',
    )
    g.add_argument(
        "--distribution_strategy",
        default=PS_STRATEGY,
        choices=DISTRIBUTION_STRATEGIES,
        help="ParameterServerStrategy (default; at least one PS) or AllreduceStrategy",
    )
    g.add_argument(
        "--checkpoint_steps",
        type=non_neg_int,
        default=0,
        help="Checkpoint every N model versions (0: off)",
    )
    g.add_argument("--checkpoint_dir", default="", help="Directory for checkpoints")
    g.add_argument(
        "--keep_checkpoint_max",
        type=non_neg_int,
        default=0,
        help="Checkpoints to keep (0: keep all)",
    )
    g.add_argument("--output", default="", help="Where the trained model is exported (SavedModel)")


def add_job_params(parser) -> None:
    """Flags describing the job and the cluster resources it runs with."""
    g = parser.add_argument_group("job")
    g.add_argument(
        "--job_name",
        required=True,
        help=f"Unique job name: lowercase letters, digits and '-', at most {MAX_JOB_NAME_LENGTH} characters",
    )
    g.add_argument(
        "--platform",
        default=None,
        choices=PLATFORMS,
        help="Where the job runs: local processes or Kubernetes pods (default: kubernetes when "
        "--image_name is given, else local)",
    )
    g.add_argument(
        "--job_dir",
        default="",
        help="Local platform: job directory with status and logs (default: ~/.elasticdl/jobs/<job_name>)",
    )
    g.add_argument("--image_name", default="", help="Docker image of the job (Kubernetes)")
    g.add_argument(
        "--worker_image", default="", help="Image of workers and PS (default: --image_name)"
    )
    g.add_argument(
        "--master_resource_request",
        default="cpu=0.1,memory=1024Mi",
        help="Master resources, e.g. cpu=1,memory=2048Mi",
    )
    g.add_argument(
        "--master_resource_limit", default="", help="Master resource limit (default: the request)"
    )
    g.add_argument("--num_workers", type=int, default=2, help="Number of workers (default: 2)")
    g.add_argument(
        "--worker_resource_request",
        default="cpu=1,memory=4096Mi",
        help="Worker resources, e.g. cpu=1,memory=4096Mi,gpu=1",
    )
    g.add_argument(
        "--worker_resource_limit", default="", help="Worker resource limit (default: the request)"
    )
    g.add_argument("--master_pod_priority", default="", help="PriorityClass of the master pod")
    g.add_argument(
        "--worker_pod_priority",
        default="",
        help="Worker priority: high, low, or a fraction like 0.5 (that share of the workers is high)",
    )
    g.add_argument(
        "--num_ps_pods",
        type=non_neg_int,
        default=0,
        help="Number of parameter servers (0 with ParameterServerStrategy means 1)",
    )
    g.add_argument("--ps_resource_request", default="cpu=1,memory=4096Mi", help="PS resources")
    g.add_argument(
        "--ps_resource_limit", default="", help="PS resource limit (default: the request)"
    )
    g.add_argument("--ps_pod_priority", default="", help="PriorityClass of the PS pods")
    g.add_argument(
        "--volume",
        default="",
        help="Volumes: 'claim_name=c1,mount_path=/p;host_path=/h,mount_path=/q[,type=Directory][,sub_path=s]'",
    )
    g.add_argument(
        "--image_pull_policy",
        default="Always",
        choices=IMAGE_PULL_POLICIES,
        help="Image pull policy",
    )
    g.add_argument(
        "--restart_policy", default="Never", choices=RESTART_POLICIES, help="Pod restart policy"
    )
    g.add_argument(
        "--envs", default="", help="Environment of master, workers and PS: 'k1=v1,k2=v2'"
    )
    g.add_argument(
        "--populate_env_names",
        default="",
        help="Names or regexes (comma-separated) of master environment variables copied to workers and PS",
    )
    g.add_argument(
        "--extra_pypi_index", default=DEFAULT_EXTRA_PYPI_INDEX, help="Extra PyPI index for images"
    )
    g.add_argument("--namespace", default="default", help="Kubernetes namespace")
    g.add_argument(
        "--kube_context", default="", help="kubeconfig context (default: the current context)"
    )
    g.add_argument(
        "--num_minibatches_per_task",
        type=pos_int,
        default=8,
        help="Minibatches per task (data shard)",
    )
    g.add_argument(
        "--cluster_spec",
        default="",
        help="Python file defining `cluster` with with_pod/with_service patchers",
    )
    g.add_argument(
        "--cluster_spec_json",
        default="",
        help="JSON with pod_spec/service_spec/master_pod_spec/worker_pod_spec/ps_pod_spec patches",
    )
    g.add_argument(
        "--yaml",
        default="",
        help="Kubernetes: write the master pod YAML to this file instead of submitting",
    )
    add_bool_param(
        g, "--force_use_kube_config_file", False, "Use the kubeconfig file even inside a cluster"
    )
    g.add_argument("--aux_params", default="", help="Auxiliary parameters, e.g. disable_relaunch")
    g.add_argument("--log_file_path", default="", help="Also write the master log to this file")


def add_train_params(parser) -> None:
    """All flags of ``elasticdl train``."""
    add_model_params(parser)
    add_job_params(parser)
    g = parser.add_argument_group("train")
    g.add_argument(
        "--num_epochs", type=int, default=1, help="Epochs to train (<= 0: until stopped)"
    )
    g.add_argument(
        "--grads_to_wait", type=pos_int, default=1, help="Gradients the PS waits for (sync SGD)"
    )
    g.add_argument("--training_data", default="", help="Training data (e.g. a RecordIO directory)")
    g.add_argument(
        "--validation_data", default="", help="Validation data for evaluation during training"
    )
    g.add_argument(
        "--evaluation_steps",
        type=non_neg_int,
        default=0,
        help="Evaluate every N model versions (0: off)",
    )
    g.add_argument(
        "--checkpoint_dir_for_init", default="", help="Checkpoint to initialise the model from"
    )
    g.add_argument(
        "--sync_version_tolerance",
        type=non_neg_int,
        default=0,
        help="Staleness tolerated in sync SGD",
    )
    g.add_argument("--log_loss_steps", type=pos_int, default=100, help="Log the loss every N steps")
    g.add_argument(
        "--max_step", type=non_neg_int, default=0, help="Stop after this many steps (0: no limit)"
    )
    add_bool_param(g, "--use_async", False, "Asynchronous SGD")
    add_bool_param(
        g, "--lr_staleness_modulation", False, "Scale the learning rate by gradient staleness"
    )
    # Default true (the original: false, so every model-zoo job had to pass
    # --need_elasticdl_job_service=true or the master refused to start).
    add_bool_param(
        g,
        "--need_elasticdl_job_service",
        True,
        "Run the ElasticDL job service (tasks for model-zoo jobs)",
    )
    add_bool_param(g, "--need_task_manager", True, "Run the task manager")
    add_bool_param(g, "--need_pod_manager", True, "Run the pod manager")
    add_bool_param(g, "--task_fault_tolerance", True, "Re-queue the tasks of failed workers")
    add_bool_param(g, "--relaunch_timeout_worker", False, "Relaunch workers whose tasks time out")
    g.add_argument(
        "--job_command", default="", help="Command run in workers instead of the ElasticDL worker"
    )
    add_bool_param(g, "--need_tf_config", False, "Set TF_CONFIG in workers and PS")
    g.add_argument(
        "--relaunch_on_worker_failure",
        type=non_neg_int,
        default=1,
        help="Relaunches allowed per failed worker",
    )


def add_evaluate_params(parser) -> None:
    """All flags of ``elasticdl evaluate``."""
    add_model_params(parser)
    add_job_params(parser)
    g = parser.add_argument_group("evaluate")
    g.add_argument("--validation_data", default="", help="Data to evaluate on (required)")
    g.add_argument(
        "--checkpoint_dir_for_init",
        default="",
        help="Checkpoint of the model to evaluate (required)",
    )
    parser.set_defaults(job_type=JobType.EVALUATION_ONLY)


def add_predict_params(parser) -> None:
    """All flags of ``elasticdl predict``."""
    add_model_params(parser)
    add_job_params(parser)
    g = parser.add_argument_group("predict")
    g.add_argument("--prediction_data", default="", help="Data to predict on (required)")
    g.add_argument(
        "--prediction_outputs_processor",
        default="PredictionOutputsProcessor",
        help="Name of the prediction-outputs processor class in the model file",
    )
    g.add_argument(
        "--checkpoint_dir_for_init", default="", help="Checkpoint of the model (required)"
    )
    parser.set_defaults(job_type=JobType.PREDICTION_ONLY)


def _add_master_only_params(parser) -> None:
    g = parser.add_argument_group("master")
    g.add_argument("--port", type=pos_int, default=DEFAULT_MASTER_PORT, help="Master gRPC port")
    g.add_argument(
        "--job_type",
        default="",
        choices=("",) + JobType.ALL,
        help="Job type (default: derived from the data flags)",
    )
    g.add_argument("--prediction_data", default="", help="Data to predict on")
    g.add_argument(
        "--prediction_outputs_processor",
        default="PredictionOutputsProcessor",
        help="Prediction outputs processor",
    )


def master_parser(prog: str = "elasticdl.master.main") -> StrictArgumentParser:
    parser = StrictArgumentParser(prog=prog, description="ElasticDL master")
    add_train_params(parser)
    _add_master_only_params(parser)
    return parser


def parse_master_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the master's argv (everything the client sends + ``--port`` and ``--job_type``).

    Returns a normalised Namespace: ``platform`` and ``job_dir`` resolved, ``job_type`` derived
    from the data flags if not given, ``num_ps_pods >= 1`` for ParameterServerStrategy.
    Raises :class:`ArgumentError` on bad input.
    """
    args = master_parser().parse_args(argv)
    normalize_job_args(args)
    validate_job_args(args, check_local_paths=False)
    return args


# --------------------------------------------------------------------------------------------
# Normalisation and derived values
# --------------------------------------------------------------------------------------------


def elasticdl_home() -> str:
    """``$ELASTICDL_HOME`` or ``~/.elasticdl``: config file and local job directories."""
    return os.path.abspath(os.path.expanduser(os.environ.get("ELASTICDL_HOME") or "~/.elasticdl"))


def jobs_root() -> str:
    """Directory holding one sub-directory per local job."""
    return os.path.join(elasticdl_home(), "jobs")


def default_job_dir(job_name: str) -> str:
    return os.path.join(jobs_root(), job_name)


def infer_job_type(args: argparse.Namespace) -> str:
    if getattr(args, "prediction_data", ""):
        return JobType.PREDICTION_ONLY
    if getattr(args, "training_data", ""):
        if getattr(args, "validation_data", ""):
            return JobType.TRAINING_WITH_EVALUATION
        return JobType.TRAINING_ONLY
    if getattr(args, "validation_data", ""):
        return JobType.EVALUATION_ONLY
    return JobType.TRAINING_ONLY


def normalize_job_args(args: argparse.Namespace) -> list[str]:
    """Fill derived defaults in place; returns human-readable notices about what was decided.

    * ``platform``: kubernetes when ``--image_name`` is set, else local.
    * ``job_dir``: ``~/.elasticdl/jobs/<job_name>`` (absolute) for the local platform.
    * ``num_ps_pods``: 1 for ParameterServerStrategy when 0 (the original silently switched to
      AllReduce instead, see the module docstring).
    """
    notices: list[str] = []
    if not getattr(args, "job_type", ""):
        args.job_type = infer_job_type(args)
    if not getattr(args, "platform", None):
        args.platform = PLATFORM_KUBERNETES if getattr(args, "image_name", "") else PLATFORM_LOCAL
        reason = (
            "--image_name is set"
            if args.platform == PLATFORM_KUBERNETES
            else "no --image_name given"
        )
        notices.append(f"platform: {args.platform} ({reason}; override with --platform)")
    if hasattr(args, "job_dir"):
        if args.job_dir:
            args.job_dir = os.path.abspath(os.path.expanduser(args.job_dir))
        elif args.platform == PLATFORM_LOCAL and getattr(args, "job_name", ""):
            args.job_dir = default_job_dir(args.job_name)
    if (
        getattr(args, "distribution_strategy", None) == PS_STRATEGY
        and getattr(args, "num_ps_pods", None) == 0
        and not getattr(args, "job_command", "")
    ):
        args.num_ps_pods = 1
        notices.append(
            "num_ps_pods: 1 (ParameterServerStrategy needs a parameter server; set --num_ps_pods to change)"
        )
    return notices


def parse_envs(envs: str) -> dict[str, str]:
    """``"k1=v1,k2=v2"`` -> dict. A piece without '=' belongs to the previous value, so
    ``"A=x,y,B=z"`` gives ``{"A": "x,y", "B": "z"}``."""
    result: dict[str, str] = {}
    last = None
    for piece in envs.split(","):
        if not piece.strip() and last is None:
            continue
        if "=" in piece:
            key, value = piece.split("=", 1)
            key = key.strip()
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise ArgumentError(
                    f"--envs: {key!r} is not a valid environment variable name; use 'NAME=value,...'"
                )
            result[key] = value
            last = key
        elif last is not None:
            result[last] += "," + piece
        else:
            raise ArgumentError(f"--envs: {piece!r} has no '='; use 'NAME=value,NAME2=value2'")
    return result


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def validate_job_name(name: str) -> None:
    if not name:
        raise ArgumentError("--job_name is required; e.g. --job_name=mnist-train")
    if len(name) > MAX_JOB_NAME_LENGTH:
        raise ArgumentError(
            f"--job_name {name!r} is {len(name)} characters; use at most {MAX_JOB_NAME_LENGTH} "
            "(it becomes part of Kubernetes pod names)"
        )
    if not _DNS1123_LABEL.match(name):
        suggestion = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "my-job"
        raise ArgumentError(
            f"--job_name {name!r} is invalid: use lowercase letters, digits and '-', starting and "
            f"ending with a letter or digit (e.g. {suggestion!r})"
        )


def _looks_like_local_path(value: str) -> bool:
    # Data sources may also be table names ("project.table") or URLs; only check what is
    # clearly a filesystem path.
    return "://" not in value and (os.sep in value or value.startswith((".", "~")))


def validate_job_args(args: argparse.Namespace, check_local_paths: bool | None = None) -> None:
    """Check a parsed job Namespace; raise :class:`ArgumentError` naming the flag and the fix.

    ``check_local_paths`` (default: on for the local platform) also checks that the model zoo,
    the model file and local data paths exist on this machine.
    """
    from elasticdl.k8s import resources as k8s_resource
    from elasticdl.k8s import volumes as k8s_volume

    validate_job_name(getattr(args, "job_name", ""))
    platform = getattr(args, "platform", None) or PLATFORM_LOCAL
    if platform not in PLATFORMS:
        raise ArgumentError(
            f"--platform {platform!r} is invalid; use one of {', '.join(PLATFORMS)}"
        )
    if check_local_paths is None:
        check_local_paths = platform == PLATFORM_LOCAL

    if args.minibatch_size <= 0:
        raise ArgumentError(f"--minibatch_size must be > 0, got {args.minibatch_size}")
    if args.num_workers < 1:
        raise ArgumentError(f"--num_workers must be >= 1, got {args.num_workers}")
    if (
        args.distribution_strategy == PS_STRATEGY
        and args.num_ps_pods < 1
        and not getattr(args, "job_command", "")
    ):
        raise ArgumentError("--num_ps_pods must be >= 1 with ParameterServerStrategy")
    if platform == PLATFORM_KUBERNETES and not args.image_name:
        raise ArgumentError(
            "--image_name is required on Kubernetes; build one with 'elasticdl zoo build'"
        )

    job_command = getattr(args, "job_command", "")
    if not job_command:
        if not args.model_def:
            raise ArgumentError(
                "--model_def is required, e.g. --model_def=mnist.mnist_functional_api.custom_model"
            )
        if not _MODEL_DEF.match(args.model_def):
            raise ArgumentError(
                f"--model_def {args.model_def!r} is not a dotted path 'package.module.function' "
                "(e.g. mnist.mnist_functional_api.custom_model)"
            )
        if check_local_paths:
            _check_model_zoo(args.model_zoo, args.model_def)

    job_type = getattr(args, "job_type", "") or infer_job_type(args)
    if job_type == JobType.PREDICTION_ONLY:
        if getattr(args, "training_data", "") or getattr(args, "validation_data", ""):
            raise ArgumentError(
                "--prediction_data cannot be combined with --training_data or --validation_data; run separate jobs"
            )
        if not args.prediction_data:
            raise ArgumentError("--prediction_data is required to predict")
        if not args.checkpoint_dir_for_init:
            raise ArgumentError(
                "--checkpoint_dir_for_init is required to predict (the trained model's checkpoint)"
            )
    elif job_type == JobType.EVALUATION_ONLY:
        if not args.validation_data:
            raise ArgumentError("--validation_data is required to evaluate")
        if not args.checkpoint_dir_for_init:
            raise ArgumentError(
                "--checkpoint_dir_for_init is required to evaluate (the model's checkpoint)"
            )
    else:
        if not getattr(args, "training_data", "") and not job_command:
            raise ArgumentError(
                "--training_data is required to train, e.g. --training_data=/data/mnist/train"
            )
        if job_type == JobType.TRAINING_WITH_EVALUATION and not args.validation_data:
            raise ArgumentError(
                "--validation_data is required for job type training_with_evaluation"
            )
        if getattr(args, "evaluation_steps", 0) > 0 and not args.validation_data:
            raise ArgumentError(
                "--evaluation_steps needs --validation_data (the data to evaluate on)"
            )

    if args.checkpoint_steps > 0 and not args.checkpoint_dir:
        raise ArgumentError(
            "--checkpoint_steps needs --checkpoint_dir (where checkpoints are written)"
        )

    if check_local_paths:
        for flag in (
            "training_data",
            "validation_data",
            "prediction_data",
            "checkpoint_dir_for_init",
        ):
            value = getattr(args, flag, "")
            if (
                value
                and _looks_like_local_path(value)
                and not os.path.exists(os.path.expanduser(value))
            ):
                raise ArgumentError(
                    f"--{flag} {value!r} does not exist on this machine; check the path"
                )

    for flag in (
        "master_resource_request",
        "master_resource_limit",
        "worker_resource_request",
        "worker_resource_limit",
        "ps_resource_request",
        "ps_resource_limit",
    ):
        value = getattr(args, flag, "")
        if value:
            try:
                k8s_resource.parse_resource(value)
            except ValueError as e:
                raise ArgumentError(f"--{flag}: {e}") from None
    for kind in ("master", "worker", "ps"):
        request, limit = getattr(args, f"{kind}_resource_request", ""), getattr(
            args, f"{kind}_resource_limit", ""
        )
        if request and limit:
            try:
                k8s_resource.check_limit_not_below_request(request, limit)
            except ValueError as e:
                raise ArgumentError(f"--{kind}_resource_limit: {e}") from None
    if getattr(args, "yaml", "") and platform != PLATFORM_KUBERNETES:
        raise ArgumentError(
            "--yaml writes a Kubernetes manifest; use it with --platform=kubernetes and --image_name"
        )
    if args.volume:
        try:
            k8s_volume.parse_volumes(args.volume)
        except ValueError as e:
            raise ArgumentError(f"--volume: {e}") from None
    if args.envs:
        parse_envs(args.envs)
    _check_worker_priority(args.worker_pod_priority)
    if args.cluster_spec and args.cluster_spec_json:
        raise ArgumentError("--cluster_spec and --cluster_spec_json are exclusive; pass only one")


def _check_model_zoo(model_zoo: str, model_def: str) -> None:
    zoo = os.path.expanduser(model_zoo or ".")
    if not os.path.isdir(zoo):
        raise ArgumentError(
            f"--model_zoo {model_zoo!r} is not a directory; point it at your model zoo"
        )
    module_path = model_def.rsplit(".", 1)[0].replace(".", os.sep)
    candidates = [
        os.path.join(zoo, module_path + ".py"),
        os.path.join(zoo, module_path, "__init__.py"),
    ]
    if not any(os.path.isfile(c) for c in candidates):
        where = "--model_zoo" if model_zoo else "the current directory (set --model_zoo)"
        raise ArgumentError(
            f"--model_def {model_def!r}: no file {module_path}.py under {where} ({os.path.abspath(zoo)})"
        )


def _check_worker_priority(value: str) -> None:
    if not value or value in ("high", "low"):
        return
    try:
        fraction = float(value)
    except ValueError:
        fraction = -1.0
    if not 0.0 <= fraction <= 1.0:
        raise ArgumentError(
            f"--worker_pod_priority {value!r} is invalid; use 'high', 'low' or a fraction in [0, 1] like 0.5"
        )


# --------------------------------------------------------------------------------------------
# Serialisation (client -> master -> workers)
# --------------------------------------------------------------------------------------------


def _format_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def build_arguments_from_parsed_result(
    args: argparse.Namespace, filter_args: Iterable[str] | None = None
) -> list[str]:
    """Turn a parsed Namespace back into ``["--key=value", ...]``.

    Keys in ``filter_args`` and :data:`CLIENT_ONLY_ARGS`, private keys (``_name``) and ``None``
    values (meaning "not set") are left out. The ``--k=v`` form keeps values that start with '-' or are
    empty intact, so parsing the result gives back the same Namespace.
    """
    skip = set(filter_args or ()) | CLIENT_ONLY_ARGS
    result = []
    for key, value in sorted(vars(args).items()):
        if key in skip or key.startswith("_") or value is None or callable(value):
            continue
        result.append(f"--{key}={_format_value(value)}")
    return result


def wrap_python_args_with_string(args: Sequence[str]) -> list[str]:
    """Quote the values of an argv for a shell command line (``bash -c "python -m ... "``).

    ``--k=v`` becomes ``--k='v'`` and a bare value ``v`` becomes ``'v'``; flags without a value
    stay as they are. Quoting uses POSIX shell rules, so values containing quotes survive.
    """
    result = []
    for item in args:
        if item.startswith("--"):
            if "=" in item:
                key, value = item.split("=", 1)
                result.append(f"{key}={_shell_quote(value)}")
            else:
                result.append(item)
        else:
            result.append(_shell_quote(item))
    return result


def _shell_quote(value: str) -> str:
    # shlex.quote leaves "safe" words bare; always quote so the form is predictable.
    return "'" + value.replace("'", "'\"'\"'") + "'"


__all__ = [
    "ArgumentError",
    "StrictArgumentParser",
    "JobType",
    "add_bool_param",
    "add_train_params",
    "add_evaluate_params",
    "add_predict_params",
    "build_arguments_from_parsed_result",
    "infer_job_type",
    "master_parser",
    "normalize_job_args",
    "parse_bool",
    "parse_envs",
    "parse_master_args",
    "validate_job_args",
    "wrap_python_args_with_string",
]
