"""Resource strings (``cpu=1,memory=4096Mi,gpu=1``), parsed where the job spec checks them:
:mod:`elasticdl.common.job_spec.resources`. The names the pod builders use, here too."""

from elasticdl.common.job_spec.resources import (  # noqa: F401
    NVIDIA_GPU,
    ResourceError,
    check_limit_not_below_request,
    parse_quantity,
    parse_resource,
)
