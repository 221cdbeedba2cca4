"""The job-submitting commands and their flags (kept free of heavy imports: ``--help`` uses it)."""

from __future__ import annotations

import argparse

from elasticdl.common import args as job_args

JOB_COMMANDS = {
    "train": (job_args.add_train_params, "Train a model"),
    "evaluate": (job_args.add_evaluate_params, "Evaluate a model checkpoint on validation data"),
    "predict": (job_args.add_predict_params, "Predict with a model checkpoint"),
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
    parser = job_args.StrictArgumentParser(prog=f"elasticdl {command}", description=JOB_COMMANDS[command][1])
    add_job_command_params(command, parser)
    return parser
