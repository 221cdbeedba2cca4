"""From what a user gave (flags or keyword arguments) to a submitted job: the CLI and the API
share this, so both build, complete and check the job spec the same way."""

from __future__ import annotations

import argparse
from typing import Any, Mapping

from elasticdl.client.backend import JobBackend, JobHandle, get_backend
from elasticdl.client.config import ClientConfig, load_config, with_config
from elasticdl.common import job_spec
from elasticdl.common.job_spec import JobSpec
from elasticdl.common.spec_codec import SpecError
from elasticdl.common.types import PlatformName


def spec_from_flags(
    command: str, namespace: argparse.Namespace, config: ClientConfig | None = None
) -> tuple[JobSpec, list[str]]:
    """The resolved spec of ``elasticdl <command> <flags>`` and notices for the user. Raises
    ``ValueError`` subclasses; nothing is created on disk or in a cluster."""
    values = with_config(
        job_spec.given_values(namespace), config if config is not None else load_config()
    )
    return job_spec.spec_from_text(command, values).resolve()


def spec_from_values(
    command: str, values: Mapping[str, Any], config: ClientConfig | None = None
) -> tuple[JobSpec, list[str]]:
    """The resolved spec from typed keyword arguments (``elasticdl.api.train(...)``)."""
    values = with_config(dict(values), config if config is not None else load_config())
    return job_spec.spec_from_values(command, values).resolve()


def submit(spec: JobSpec, yaml_path: str = "") -> tuple[JobBackend, JobHandle]:
    """Start the job of a resolved spec; with ``yaml_path`` (Kubernetes) only write the
    master pod's manifest there. A spec with ``--image_base`` (build form) first gets its
    model-zoo image built and pushed (:mod:`elasticdl.client.zoo_image`, progress on stderr)."""
    if yaml_path and spec.platform != PlatformName.KUBERNETES:
        raise SpecError(
            "--yaml writes a Kubernetes manifest; use it with --platform=kubernetes and --image_name"
        )
    if spec.image_base:
        import sys

        from elasticdl.client import zoo_image

        spec, notices = zoo_image.prepare(spec)
        for notice in notices:
            print(f"elasticdl: {notice}", file=sys.stderr, flush=True)
    backend = get_backend(spec.platform, spec.namespace, spec.kube_context)
    return backend, backend.submit(spec, yaml_path=yaml_path)
