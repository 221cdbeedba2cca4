"""FastAPI dependencies shared by every router of the server (the dashboard's too)."""

from __future__ import annotations

from elasticdl.server.errors import Unauthorized
from fastapi import Request


def current_user(request: Request) -> str:
    """The user of the request's bearer token; 401 without a valid one."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing bearer token; send 'Authorization: Bearer <token>'")
    user = request.app.state.services.tokens.authenticate(token.strip())
    if user is None:
        raise Unauthorized(
            "invalid token; ask the server's admin for one (elasticdl server add-user)"
        )
    return user
