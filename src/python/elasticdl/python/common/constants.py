"""``elasticdl.python.common.constants``: the names model files of the original import.

``Mode``, ``JobType`` and ``DistributionStrategy`` are this project's own enums (string
valued, so ``mode == Mode.TRAINING`` and ``mode == "training"`` both hold).
"""
from elasticdl.common.model_utils import Mode
from elasticdl.common.types import JobType
from elasticdl.common.types import Strategy as DistributionStrategy

__all__ = ["DistributionStrategy", "JobType", "MaxComputeConfig", "Mode", "ODPSConfig"]


class MaxComputeConfig:
    """Environment variable names of a MaxCompute (ODPS) account. This project has no ODPS
    reader; model files read these names only when ``is_odps_configured()`` says so."""

    PROJECT_NAME = "MAXCOMPUTE_PROJECT"
    ACCESS_ID = "MAXCOMPUTE_AK"
    ACCESS_KEY = "MAXCOMPUTE_SK"
    ENDPOINT = "MAXCOMPUTE_ENDPOINT"
    TUNNEL_ENDPOINT = "MAXCOMPUTE_TUNNEL_ENDPOINT"


# The name older model files used.
ODPSConfig = MaxComputeConfig
