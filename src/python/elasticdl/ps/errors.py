"""Errors the parameter server reports to its callers.

Every error a client can cause (bad gradient shape, unknown table, bad flag) is a `PSError`, a
`ValueError` subclass with a one-line message naming the field at fault: the gRPC servicer turns
it into INVALID_ARGUMENT and the CLI into exit status 2.
"""
from __future__ import annotations


class PSError(ValueError):
    """A request or configuration the PS cannot accept; the message says what to fix."""


class NotFoundError(PSError):
    """A named table or parameter does not exist on this PS."""


class RegionNotAttachedError(PSError):
    """A push names a shared-memory region this PS does not hold (it was relaunched since):
    the worker attaches again, or sends the gradients in the message."""
