"""Flags of the original ElasticDL that selected modes this one does not have."""

from __future__ import annotations

import dataclasses
from typing import Any

from elasticdl.common import spec_codec
from elasticdl.common.spec_codec import SpecError, parse_bool


@dataclasses.dataclass(frozen=True)
class RetiredFlag:
    """A flag of the original ElasticDL that selected a mode this one does not have. The value
    that means what every job here does is still accepted (tutorials pass it); any other value
    is an error that says why."""

    accepted: Any
    why: str


RETIRED_FLAGS = {
    "need_elasticdl_job_service": RetiredFlag(
        True,
        "jobs always run ElasticDL's task service; a custom --job_command without it is not supported",
    ),
    "need_task_manager": RetiredFlag(
        True, "the master's task manager is what shards the data; it cannot be turned off"
    ),
    "need_pod_manager": RetiredFlag(
        True, "the master's replica manager starts and relaunches replicas; it cannot be turned off"
    ),
    "task_fault_tolerance": RetiredFlag(
        True,
        "the tasks of a failed worker are always re-queued (that is how every record is trained "
        "exactly once); use --relaunch_on_worker_failure=0 to not relaunch workers",
    ),
    "need_tf_config": RetiredFlag(
        False, "TF_CONFIG served --job_command jobs, which are not supported"
    ),
    "job_command": RetiredFlag(
        "", "custom worker commands are not supported; train a model-zoo model with --model_def"
    ),
}


def check_retired(name: str, value: Any) -> None:
    retired = RETIRED_FLAGS[name]
    if isinstance(retired.accepted, bool):
        try:
            value = parse_bool(value)
        except ValueError as e:
            raise SpecError(f"--{name}: {e}") from None
    if value != retired.accepted:
        raise SpecError(
            f"--{name}={spec_codec.to_text(value)} was removed: {retired.why} "
            f"(drop the flag or pass --{name}={spec_codec.to_text(retired.accepted)})"
        )
