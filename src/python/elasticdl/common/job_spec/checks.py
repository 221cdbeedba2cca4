"""Checks of single fields, each raising :class:`SpecError` that names the flag and the fix.

A field declares its check in its metadata (``"check"``) and :func:`check_fields` runs them
whenever a spec is built: the job spec and the replica specs derived from it
(``elasticdl.common.replica_spec``) use the same functions, so a rule such as "minibatch_size
> 0" is written once and holds for every process. Checks of fields against each other are
``resolve``'s."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

from elasticdl.common import spec_codec
from elasticdl.common.job_spec.resources import parse_resource
from elasticdl.common.job_spec.values import (
    aux_param_set,
    env_name_patterns,
    parse_envs,
    parse_pull_secrets,
    parse_secret_envs,
)
from elasticdl.common.job_spec.volumes import parse_volumes
from elasticdl.common.spec_codec import SpecError

Check = Callable[[str, Any], None]

AUX_PARAMS = ("disable_relaunch",)
# Replica names are "elasticdl-<job>-worker-<id>" (pods, services, log files). A DNS-1123
# label has at most 63 characters; keep room for the prefix and a 5-digit replica id.
MAX_JOB_NAME_LENGTH = 63 - len("elasticdl-") - len("-worker-99999")  # 40
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_MODEL_DEF = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def check_fields(spec: Any) -> None:
    """Every field of the frozen dataclass ``spec`` has its declared type
    (``spec_codec.check_types``) and passes its check."""
    spec_codec.check_types(spec)
    for f in dataclasses.fields(spec):
        check = f.metadata.get("check")
        if check is not None:
            check(f.name, getattr(spec, f.name))


def checked(check: Check, default: Any = dataclasses.MISSING) -> Any:
    """A dataclass field whose values ``check`` accepts (:func:`check_fields`)."""
    return dataclasses.field(default=default, metadata={"check": check})


def positive(name: str, value: int) -> None:
    if value <= 0:
        raise SpecError(f"--{name} must be > 0, got {value}")


def non_negative(name: str, value: int) -> None:
    if value < 0:
        raise SpecError(f"--{name} must be >= 0, got {value}")


def one_of(choices: tuple[str, ...]) -> Callable[[str, str], None]:
    def check(name: str, value: str) -> None:
        if value not in choices:
            raise SpecError(f"--{name} {value!r} is invalid; use one of {', '.join(choices)}")

    return check


def port(name: str, value: int) -> None:
    if not 0 <= value < 65536:
        raise SpecError(f"--{name} must be in [0, 65535], got {value}")


def job_name(name: str, value: str) -> None:
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


def image(name: str, value: str) -> None:
    if value and not _IMAGE.match(value):
        raise SpecError(
            f"--{name} {value!r} is not an image name; use e.g. registry.example.com/team/model:v1 "
            "(lowercase, no spaces)"
        )


def image_prefix(name: str, value: str) -> None:
    if value and not _IMAGE.match(image_in_prefix(value, "elasticdl:tag")):
        raise SpecError(
            f"--{name} {value!r} is not a registry prefix; use e.g. registry.example.com/team/ "
            "(the image becomes <prefix>elasticdl:<tag>)"
        )


def image_in_prefix(prefix: str, name: str) -> str:
    """``--docker_image_prefix`` + an image name: ``reg.example.com/team/`` or
    ``reg.example.com/team`` + ``elasticdl:t`` -> ``reg.example.com/team/elasticdl:t``."""
    return f"{prefix.rstrip('/')}/{name}" if prefix else name


def namespace(name: str, value: str) -> None:
    if not _DNS1123_LABEL.match(value or "") or len(value) > 63:
        raise SpecError(
            f"--{name} {value!r} is not a Kubernetes namespace name: use lowercase letters, "
            "digits and '-' (at most 63)"
        )


def model_def(name: str, value: str) -> None:
    if value and not _MODEL_DEF.match(value):
        raise SpecError(
            f"--model_def {value!r} is not a dotted path 'package.module.function' "
            "(e.g. mnist.mnist_functional_api.custom_model)"
        )


def resource(name: str, value: str) -> None:
    if value:
        try:
            parse_resource(value)
        except ValueError as e:
            raise SpecError(f"--{name}: {e}") from None


def volume(name: str, value: str) -> None:
    if value:
        try:
            parse_volumes(value)
        except ValueError as e:
            raise SpecError(f"--{name}: {e}") from None


def envs(name: str, value: str) -> None:
    parse_envs(value)


def secret_envs(name: str, value: str) -> None:
    parse_secret_envs(value)


def pull_secrets(name: str, value: str) -> None:
    parse_pull_secrets(value, f"--{name}")


def env_patterns(name: str, value: str) -> None:
    for pattern in env_name_patterns(value):
        try:
            re.compile(pattern)
        except re.error as e:
            raise SpecError(f"--{name}: {pattern!r} is not a valid regex ({e})") from None


def aux_params(name: str, value: str) -> None:
    unknown = sorted(aux_param_set(value) - set(AUX_PARAMS))
    if unknown:
        raise SpecError(f"--{name}: unknown {', '.join(unknown)}; known: {', '.join(AUX_PARAMS)}")


def params(name: str, value: str) -> None:
    for item in (value or "").split(";"):
        key = item.split("=", 1)[0].strip()
        if item.strip() and ("=" not in item or not key):
            raise SpecError(f"--{name}: {item.strip()!r} is not key=value; use 'k1=v1; k2=v2'")


def straggler_factor(name: str, value: float) -> None:
    if value != 0 and not value >= 1:
        raise SpecError(f"--{name} must be 0 (off) or at least 1, got {value:g}")


def fraction(name: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise SpecError(f"--{name} must be in [0, 1), e.g. 0.1 for 10%, got {value:g}")


def optional_fraction(name: str, value: float | None) -> None:
    """None (not given: the field's rule decides) or a fraction."""
    if value is not None:
        fraction(name, value)


def worker_priority(name: str, value: str) -> None:
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
