"""From what a user gave (typed values of one command's fields, or a whole spec) to the spec
a backend submits: the CLI and the API build, complete and check a job spec the same way."""

from __future__ import annotations

from typing import Any, Mapping

from elasticdl.common import job_spec
from elasticdl.common.job_spec import JobSpec
from elasticdl.common.types import JobType, PlatformName
from elasticdl.jobs.config import ClientConfig, with_config

_JOB_TYPE_COMMAND = {
    JobType.EVALUATION_ONLY: job_spec.EVALUATE,
    JobType.PREDICTION_ONLY: job_spec.PREDICT,
}


def given_spec(command: str | None, values: Mapping[str, Any]) -> JobSpec:
    """The spec of exactly what was given: ``command``'s typed values (its fields only), or
    without a command the values of a whole spec."""
    if command:
        return job_spec.spec_from_values(command, values)
    return JobSpec.from_dict(dict(values))


def resolved_spec(
    command: str | None, values: Mapping[str, Any], config: ClientConfig
) -> tuple[JobSpec, list[str]]:
    """The spec completed from the config file, resolved and checked, and notices about what
    was decided. A local job's inputs are checked on this machine too. Raises ``ValueError``
    subclasses; nothing is created on disk or in a cluster."""
    spec, notices = given_spec(command, with_config(dict(values), config)).resolve()
    if spec.platform == PlatformName.LOCAL:
        from elasticdl.jobs.local_inputs import check_local_inputs

        check_local_inputs(spec)
    return spec, notices


def command_for(spec: JobSpec) -> str:
    """The job command (train, evaluate, predict) that runs ``spec``."""
    return _JOB_TYPE_COMMAND.get(job_spec.infer_job_type(spec), job_spec.TRAIN)
