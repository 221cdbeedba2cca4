"""Resolving a job spec: the derived defaults (platform, job type, PS count, absolute local
paths, checkpoint directory) and the checks of fields against each other. Resolving a resolved
spec changes nothing (the master resolves what the client sent)."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from elasticdl.common.job_dir import CHECKPOINT_SUBDIR, default_job_dir
from elasticdl.common.job_spec.local_paths import (
    absolute_local_paths,
    check_model_zoo,
    looks_like_local_path,
    prebuilt_model_zoo,
)
from elasticdl.common.job_spec.resources import check_limit_not_below_request
from elasticdl.common.job_spec.volumes import parse_volumes
from elasticdl.common.spec_codec import SpecError
from elasticdl.common.types import JobType, PlatformName

if TYPE_CHECKING:
    from elasticdl.common.job_spec.fields import JobSpec


def resolve(spec: JobSpec, check_local_paths: bool | None = None) -> tuple[JobSpec, list[str]]:
    """Fill the derived defaults and check the fields against each other. Returns the
    resolved spec and notices for the user about what was decided; ``check_local_paths``
    (default: for local jobs) also checks the paths against this machine."""
    resolved, notices = with_derived_defaults(spec)
    check_together(resolved, check_local_paths)
    return resolved, notices


def with_derived_defaults(spec: JobSpec) -> tuple[JobSpec, list[str]]:
    """The spec with its derived defaults filled in, and notices that say what was decided."""
    notices: list[str] = []
    changes: dict[str, Any] = {}
    platform = spec.platform
    if platform is None:
        image_flag = (
            "--image_name" if spec.image_name else "--image_base" if spec.image_base else ""
        )
        platform = PlatformName.KUBERNETES if image_flag else PlatformName.LOCAL
        reason = f"{image_flag} is set" if image_flag else "no --image_name given"
        notices.append(f"platform: {platform} ({reason}; override with --platform)")
        changes["platform"] = platform
    if (
        spec.image_base
        and not (spec.image_name or spec.docker_image_prefix)
        and prebuilt_model_zoo(spec.model_zoo)
    ):
        # The pre-built form of the original: the zoo is a path inside the image, nothing to build.
        changes.update(image_name=spec.image_base, image_base="")
        notices.append(
            f"image: {spec.image_base} as it is (--model_zoo={spec.model_zoo} is not on this "
            "machine: the pre-built image holds it)"
        )
    if spec.job_type is None:
        changes["job_type"] = infer_job_type(spec)
    if platform == PlatformName.LOCAL:
        changes.update(absolute_local_paths(spec))
        if not spec.job_dir:
            changes["job_dir"] = default_job_dir(spec.job_name)
    if not spec.allreduce and spec.num_ps_pods == 0:
        changes["num_ps_pods"] = 1
        notices.append(
            "num_ps_pods: 1 (ParameterServerStrategy needs a parameter server; "
            "set --num_ps_pods to change)"
        )
    if spec.auto_workers and spec.num_workers != spec.min_workers:
        changes["num_workers"] = spec.min_workers  # the master starts with the minimum
    if spec.checkpoint_steps > 0 and not spec.checkpoint_dir:
        job_dir = changes.get("job_dir", spec.job_dir)
        checkpoint_dir, notice = default_checkpoint_dir(platform, job_dir)
        changes["checkpoint_dir"] = checkpoint_dir
        notices.append(notice)
    return (dataclasses.replace(spec, **changes) if changes else spec), notices


def check_together(spec: JobSpec, check_local_paths: bool | None) -> None:
    """The fields against each other (and, where the job runs here, against this machine)."""
    if check_local_paths is None:
        check_local_paths = spec.platform == PlatformName.LOCAL
    _check_image_flags(spec, check_local_paths)
    if spec.allreduce and spec.num_ps_pods:
        raise SpecError(
            f"--num_ps_pods={spec.num_ps_pods} with AllreduceStrategy: workers allreduce "
            "gradients among themselves; drop --num_ps_pods (or set it to 0)"
        )
    if not spec.model_def:
        raise SpecError(
            "--model_def is required, e.g. --model_def=mnist.mnist_functional_api.custom_model"
        )
    _check_worker_count(spec)
    _check_tls(spec, check_local_paths)
    if check_local_paths:
        check_model_zoo(spec.model_zoo, spec.model_def)
    job_type = spec.job_type or infer_job_type(spec)
    if job_type == JobType.PREDICTION_ONLY:
        if spec.training_data or spec.validation_data:
            raise SpecError(
                "--prediction_data cannot be combined with --training_data or "
                "--validation_data; run separate jobs"
            )
        if not spec.prediction_data:
            raise SpecError("--prediction_data is required to predict")
        if not spec.checkpoint_dir_for_init:
            raise SpecError(
                "--checkpoint_dir_for_init is required to predict (the trained model's checkpoint)"
            )
    elif job_type == JobType.EVALUATION_ONLY:
        if not spec.validation_data:
            raise SpecError("--validation_data is required to evaluate")
        if not spec.checkpoint_dir_for_init:
            raise SpecError(
                "--checkpoint_dir_for_init is required to evaluate (the model's checkpoint)"
            )
    else:
        if not spec.training_data:
            raise SpecError(
                "--training_data is required to train, e.g. --training_data=/data/mnist/train"
            )
        if job_type == JobType.TRAINING_WITH_EVALUATION and not spec.validation_data:
            raise SpecError("--validation_data is required for job type training_with_evaluation")
        if spec.evaluation_steps > 0 and not spec.validation_data:
            raise SpecError("--evaluation_steps needs --validation_data (the data to evaluate on)")
        if spec.evaluation_throttle_secs > 0 and not spec.validation_data:
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
            value = getattr(spec, name)
            if (
                value
                and looks_like_local_path(value)
                and not os.path.exists(os.path.expanduser(value))
            ):
                raise SpecError(
                    f"--{name} {value!r} does not exist on this machine; check the path"
                )
    for kind in ("master", "worker", "ps"):
        request = getattr(spec, f"{kind}_resource_request")
        limit = getattr(spec, f"{kind}_resource_limit")
        if request and limit:
            try:
                check_limit_not_below_request(request, limit)
            except ValueError as e:
                raise SpecError(f"--{kind}_resource_limit: {e}") from None
    if check_local_paths and spec.output:
        output = os.path.expanduser(spec.output)
        if os.path.exists(output) and not os.path.isdir(output):
            raise SpecError(
                f"--output {spec.output!r} is a file; give a directory (the model or the "
                "predictions are written into it)"
            )
    if spec.tensorboard_log_dir:
        _check_tensorboard_log_dir(spec, check_local_paths)
    if check_local_paths and spec.log_file_path:
        parent = os.path.dirname(os.path.abspath(os.path.expanduser(spec.log_file_path)))
        if not os.path.isdir(parent):
            raise SpecError(
                f"--log_file_path {spec.log_file_path!r}: directory {parent} does not exist; "
                "create it or choose another file"
            )
    if (
        check_local_paths
        and spec.cluster_spec
        and not os.path.isfile(os.path.expanduser(spec.cluster_spec))
    ):
        raise SpecError(f"--cluster_spec {spec.cluster_spec!r} is not a file; check the path")
    if spec.secret_envs:
        if spec.platform == PlatformName.LOCAL:
            raise SpecError(
                "--secret_envs reads Kubernetes Secrets, which the local platform has none "
                "of; export the variables in the shell that runs elasticdl (local replicas "
                "inherit its environment) and drop --secret_envs"
            )
        both = sorted(set(spec.secret_env_refs()) & set(spec.env_vars()))
        if both:
            raise SpecError(f"{', '.join(both)} is set by both --envs and --secret_envs; keep one")
    if spec.cluster_spec and spec.cluster_spec_json:
        raise SpecError("--cluster_spec and --cluster_spec_json are exclusive; pass only one")


def _check_image_flags(spec: JobSpec, check_local_paths: bool) -> None:
    if spec.docker_image_prefix and not spec.image_base:
        raise SpecError(
            "--docker_image_prefix needs --image_base (the base image the model zoo is built "
            "on); with a built image, pass --image_name alone"
        )
    if spec.image_base and spec.image_name:
        raise SpecError(
            "--image_base and --image_name are exclusive: --image_name runs a built image, "
            "--image_base builds one from --model_zoo (or runs it with an in-image "
            "--model_zoo); pass only one"
        )
    if spec.image_base:
        if spec.platform != PlatformName.KUBERNETES:
            raise SpecError(
                f"--image_base builds an image for Kubernetes, not for --platform="
                f"{spec.platform}; drop --image_base (local jobs use --model_zoo directly)"
            )
        if spec.docker_image_prefix and prebuilt_model_zoo(spec.model_zoo):
            raise SpecError(
                f"--docker_image_prefix: nothing to build or push, --model_zoo="
                f"{spec.model_zoo} is not on this machine (a pre-built --image_base holds "
                "it); drop --docker_image_prefix, or point --model_zoo at a local directory "
                "to build"
            )
        # Still set after resolving: the build form, which needs the zoo on this machine.
        zoo = os.path.expanduser(spec.model_zoo or ".")
        if not os.path.isdir(zoo):
            raise SpecError(
                f"--model_zoo {spec.model_zoo!r} is not a directory on this machine: give the "
                "model zoo to build into the image, or an absolute path inside a pre-built "
                "--image_base (e.g. --model_zoo=/model_zoo)"
            )
        check_model_zoo(zoo, spec.model_def)
        if spec.cluster_spec and not os.path.isfile(os.path.expanduser(spec.cluster_spec)):
            raise SpecError(
                f"--cluster_spec {spec.cluster_spec!r} is not a file; check the path (it is "
                "copied into the image)"
            )
    elif spec.platform == PlatformName.KUBERNETES and not spec.image_name:
        raise SpecError(
            "--image_name is required on Kubernetes; build one with 'elasticdl zoo build' "
            "(or pass --image_base to build it at submit time)"
        )


def _check_tensorboard_log_dir(spec: JobSpec, check_local_paths: bool) -> None:
    """The master writes there: locally a directory it can create or write; on
    Kubernetes one under a --volume mount of the master pod (anything else is lost with
    the pod)."""
    value = spec.tensorboard_log_dir
    if "://" in value:
        return  # a remote filesystem the event writer knows (e.g. s3://, gs://)
    if spec.platform == PlatformName.KUBERNETES:
        mounts = [v.mount_path.rstrip("/") for v in parse_volumes(spec.volume)]
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


def _check_worker_count(spec: JobSpec) -> None:
    """--num_workers=auto and its bounds."""
    if not spec.auto_workers:
        defaults = {f.name: f.default for f in dataclasses.fields(spec)}
        given = [
            f"--{name}"
            for name in (
                "min_workers",
                "max_workers",
                "autoscale_min_gain",
                "autoscale_pending_timeout",
            )
            if getattr(spec, name) != defaults[name]
        ]
        if given:
            raise SpecError(
                f"{', '.join(given)} only size a job with --num_workers=auto; drop "
                f"{'them' if len(given) > 1 else 'it'} or set --num_workers=auto"
            )
        return
    if spec.min_workers > spec.max_workers:
        raise SpecError(
            f"--min_workers={spec.min_workers} is more than --max_workers={spec.max_workers}; "
            "the job starts with --min_workers and grows up to --max_workers"
        )
    if spec.allreduce:
        raise SpecError(
            "--num_workers=auto sizes ParameterServerStrategy jobs; give AllreduceStrategy jobs "
            "a number of workers"
        )


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
