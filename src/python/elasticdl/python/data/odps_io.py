"""``elasticdl.python.data.odps_io``: this project reads no MaxCompute (ODPS) tables.

``is_odps_configured()`` answers as the original did (are the account's environment variables
set?), so model files that fall back to local outputs without ODPS run unchanged; building an
``ODPSWriter`` or ``ODPSReader`` says that ODPS is not supported.
"""
import os

from elasticdl.python.common.constants import MaxComputeConfig

__all__ = ["ODPSReader", "ODPSWriter", "is_odps_configured"]


def is_odps_configured():
    return all(
        os.environ.get(name)
        for name in (
            MaxComputeConfig.PROJECT_NAME,
            MaxComputeConfig.ACCESS_ID,
            MaxComputeConfig.ACCESS_KEY,
        )
    )


class _Unsupported:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            f"{type(self).__name__}: MaxCompute (ODPS) tables are not supported by this "
            "ElasticDL; export the table to RecordIO, CSV or Parquet files and read those"
        )


class ODPSWriter(_Unsupported):
    pass


class ODPSReader(_Unsupported):
    pass
