"""The job-submitting commands and their flags (kept free of heavy imports: ``--help`` uses it)."""

from __future__ import annotations

import argparse

from elasticdl.common import args as job_args

JOB_COMMANDS = {
    "train": (job_args.add_train_params, "Train a model"),
    "evaluate": (job_args.add_evaluate_params, "Evaluate a model checkpoint on validation data"),
    "predict": (job_args.add_predict_params, "Predict with a model checkpoint"),
}


# argparse's generated usage lists ~80 flags; show what a user must give instead.
USAGES = {
    "train": "%(prog)s --job_name=NAME --model_def=MODULE.FUNCTION --training_data=PATH [flags]",
    "evaluate": "%(prog)s --job_name=NAME --model_def=MODULE.FUNCTION --validation_data=PATH "
    "--checkpoint_dir_for_init=DIR [flags]",
    "predict": "%(prog)s --job_name=NAME --model_def=MODULE.FUNCTION --prediction_data=PATH "
    "--checkpoint_dir_for_init=DIR [flags]",
}


def add_job_command_params(command: str, parser: argparse.ArgumentParser) -> None:
    add_params, _ = JOB_COMMANDS[command]
    add_params(parser)
    parser.add_argument(
        "--detach",
        "-d",
        action="store_true",
        help="Return right after submitting instead of following the master log until the job ends",
    )


def job_parser(command: str) -> job_args.StrictArgumentParser:
    if command not in JOB_COMMANDS:
        raise ValueError(f"unknown job command {command!r}; use one of {', '.join(JOB_COMMANDS)}")
    parser = job_args.StrictArgumentParser(
        prog=f"elasticdl {command}", description=JOB_COMMANDS[command][1], usage=USAGES[command]
    )
    add_job_command_params(command, parser)
    return parser
