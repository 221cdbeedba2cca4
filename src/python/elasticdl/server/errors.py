"""Errors of the job server's plain classes; each carries its HTTP status and a one-line
reason (the routes turn them into ``{"detail": reason}``)."""

from __future__ import annotations


class ServerError(Exception):
    status = 400

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason.replace("\n", " ")


class BadRequest(ServerError):
    status = 400


class Unauthorized(ServerError):
    status = 401


class NotFound(ServerError):
    status = 404


class Conflict(ServerError):
    status = 409


class TooLarge(ServerError):
    status = 413


class Unprocessable(ServerError):
    status = 422
