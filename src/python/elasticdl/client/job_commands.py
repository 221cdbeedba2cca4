"""The job-submitting commands and their flags (kept free of heavy imports: ``--help`` uses it).

The job's flags are generated from :class:`~elasticdl.common.job_spec.JobSpec`; only the flags
that steer the client itself (``--detach``, ``--yaml``) are defined here.
"""

from __future__ import annotations

import argparse

from elasticdl.common import job_spec
from elasticdl.common.spec_codec import SpecError

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
    from elasticdl.client.cli_parser import StrictArgumentParser

    if command not in JOB_COMMANDS:
        raise SpecError(f"unknown job command {command!r}; use one of {', '.join(JOB_COMMANDS)}")
    parser = StrictArgumentParser(
        prog=f"elasticdl {command}", description=JOB_COMMANDS[command], usage=USAGES[command]
    )
    add_job_command_params(command, parser)
    return parser
