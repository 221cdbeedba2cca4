"""FastAPI dependencies shared by every router of the server (the dashboard's too)."""

from __future__ import annotations

from fastapi import Request


def current_user(request: Request) -> str:
    """The user of the request's bearer token; 401 without a valid one. (``request_gate`` has
    already refused a request without one before its body was read; this names the user.)"""
    tokens = request.app.state.services.tokens
    return tokens.user_of(request.headers.get("authorization", ""))
