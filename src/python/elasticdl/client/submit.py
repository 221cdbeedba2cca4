"""Turning ``train``/``evaluate``/``predict`` flags into a submitted job (CLI and API share it)."""

from __future__ import annotations

import argparse
import os

from elasticdl.client.backend import JobBackend, JobHandle, get_backend
from elasticdl.client.config import ClientConfig, apply_config, load_config
from elasticdl.common import args as job_args

# Flags holding paths on this machine; on the local platform they are made absolute so the
# job does not depend on the directory the master happens to start in.
_DATA_FLAGS = ("training_data", "validation_data", "prediction_data", "checkpoint_dir_for_init")
_OUTPUT_FLAGS = ("model_zoo", "checkpoint_dir", "output", "log_file_path", "cluster_spec")


def _absolutize_local_paths(args: argparse.Namespace) -> None:
    for flag in _DATA_FLAGS + _OUTPUT_FLAGS:
        value = getattr(args, flag, "")
        if not value or "://" in value:
            continue
        expanded = os.path.expanduser(value)
        if flag in _OUTPUT_FLAGS or os.path.exists(expanded):
            setattr(args, flag, os.path.abspath(expanded))


def prepare_job(
    args: argparse.Namespace, argv: list[str], config: ClientConfig | None = None
) -> list[str]:
    """Apply the config file, fill derived defaults and validate (in place). Returns notices
    for the user. Raises ``ValueError`` subclasses; nothing is created on disk or in a cluster."""
    apply_config(args, argv, config if config is not None else load_config())
    notices = job_args.normalize_job_args(args)
    job_args.validate_job_args(args)
    if args.platform == job_args.PLATFORM_LOCAL:
        _absolutize_local_paths(args)
    return notices


def submit_job(args: argparse.Namespace) -> tuple[JobBackend, JobHandle]:
    backend = get_backend(args.platform, args.namespace, getattr(args, "kube_context", ""))
    return backend, backend.submit(args)
