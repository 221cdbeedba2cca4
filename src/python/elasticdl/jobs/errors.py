"""Errors the job layer reports to users as one line (``elasticdl: error: ...``, exit 2)."""

from elasticdl.common.spec_codec import SpecError

# The API's name for a bad job parameter or flag.
ArgumentError = SpecError


class ClientError(ValueError):
    """A user-facing problem: bad input, missing job, missing runtime."""


class JobNotFoundError(ClientError):
    pass


class JobConflictError(ClientError):
    """A job with this name is still running."""


class NoJobServerError(ClientError):
    """A command that only a job server can answer, and the config file names none."""


class WaitTimeout(TimeoutError):
    """``wait`` gave up before the job reached a final phase (exit status 1, not 2)."""


__all__ = [
    "ArgumentError",
    "ClientError",
    "JobNotFoundError",
    "JobConflictError",
    "NoJobServerError",
    "WaitTimeout",
]
