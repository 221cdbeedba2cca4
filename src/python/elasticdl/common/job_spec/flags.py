"""Building a job spec from flags or keyword arguments: the ``train``/``evaluate``/``predict``
flags generated from the fields, and the spec from what a user typed (the CLI) or passed (the
SDK)."""

from __future__ import annotations

import argparse
import dataclasses
import enum
from typing import Any, Iterable, Mapping

from elasticdl.common import spec_codec
from elasticdl.common.job_spec.fields import EVALUATE, FIELDS, JOB_COMMANDS, PREDICT, TRAIN, JobSpec
from elasticdl.common.job_spec.retired import RETIRED_FLAGS, check_retired
from elasticdl.common.spec_codec import SpecError
from elasticdl.common.types import JobType

# What each command does, for the job type of a spec built from it (train: see job_type()).
_COMMAND_JOB_TYPE = {EVALUATE: JobType.EVALUATION_ONLY, PREDICT: JobType.PREDICTION_ONLY}


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
    aliases = {"image_name": ["--image"]}  # the original client design's spelling
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
