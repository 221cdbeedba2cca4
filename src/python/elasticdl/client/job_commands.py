"""The job-submitting commands and their flags (kept free of heavy imports: ``--help`` uses it).

The job's flags are generated from :class:`~elasticdl.common.job_spec.JobSpec`; only the flags
that steer the client itself (``--detach``, ``--yaml``) are defined here.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from elasticdl.common import job_spec
from elasticdl.common.spec_codec import SpecError

if TYPE_CHECKING:
    from elasticdl.common.job_spec import JobSpec
    from elasticdl.jobs.config import ClientConfig

JOB_COMMANDS = {
    job_spec.TRAIN: "Train a model",
    job_spec.EVALUATE: "Evaluate a model checkpoint on validation data",
    job_spec.PREDICT: "Predict with a model checkpoint",
}


# argparse's generated usage lists ~70 flags; show what a user must give instead.
USAGES = {
    "train": "%(prog)s --job_name=NAME --model_def=MODULE.FUNCTION --training_data=PATH [flags]",
    "evaluate": "%(prog)s --job_name=NAME --model_def=MODULE.FUNCTION --validation_data=PATH "
    "--checkpoint_dir_for_init=DIR [flags]",
    "predict": "%(prog)s --job_name=NAME --model_def=MODULE.FUNCTION --prediction_data=PATH "
    "--checkpoint_dir_for_init=DIR [flags]",
}


def add_job_command_params(command: str, parser: argparse.ArgumentParser) -> None:
    job_spec.add_job_flags(parser, command)
    client = parser.add_argument_group("client")
    client.add_argument(
        "--detach",
        "-d",
        action="store_true",
        help="Return right after submitting instead of following the master log until the job ends",
    )
    client.add_argument(
        "--yaml",
        default="",
        metavar="FILE",
        help="Kubernetes: write the master pod's manifest to FILE instead of submitting",
    )
    client.add_argument(
        "--package_path",
        default="",
        metavar="DIR",
        help="With a job server (server: in the config file): the model-zoo directory to upload "
        "(default: --model_zoo); the job's data paths are paths in your data directory there",
    )


def job_parser(command: str):
    from elasticdl.common.cli_parser import StrictArgumentParser

    if command not in JOB_COMMANDS:
        raise SpecError(f"unknown job command {command!r}; use one of {', '.join(JOB_COMMANDS)}")
    parser = StrictArgumentParser(
        prog=f"elasticdl {command}", description=JOB_COMMANDS[command], usage=USAGES[command]
    )
    add_job_command_params(command, parser)
    return parser


def given_job_values(command: str, args: argparse.Namespace) -> dict[str, Any]:
    """The job fields a user gave as flags, as typed values (each flag's text parsed and
    checked by its field; retired flags checked and dropped)."""
    given = job_spec.given_values(args)
    typed = job_spec.spec_from_text(command, given)
    return {name: getattr(typed, name) for name in given if name in job_spec.FIELDS}


def spec_from_flags(
    command: str, args: argparse.Namespace, config: "ClientConfig | None" = None
) -> tuple["JobSpec", list[str]]:
    """The resolved spec ``elasticdl <command> <flags>`` submits (without a job server) and
    the notices about what was decided. Raises ``ValueError`` subclasses; nothing is
    created on disk or in a cluster."""
    from elasticdl.jobs.config import load_config
    from elasticdl.jobs.given import resolved_spec

    values = given_job_values(command, args)
    return resolved_spec(command, values, config if config is not None else load_config())
