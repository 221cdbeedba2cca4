"""Errors the client reports to users as one line (``elasticdl: error: ...``, exit 2)."""

from elasticdl.common.args import ArgumentError


class ClientError(ValueError):
    """A user-facing problem: bad input, missing job, missing runtime."""


class JobNotFoundError(ClientError):
    pass


class JobConflictError(ClientError):
    """A job with this name is still running."""


class WaitTimeout(TimeoutError):
    """``wait`` gave up before the job reached a final phase (exit status 1, not 2)."""


__all__ = ["ArgumentError", "ClientError", "JobNotFoundError", "JobConflictError", "WaitTimeout"]
