"""The outermost ASGI layer of the job server: who may send a body, and how slowly.

* **The token before the body.** Every request except the dashboard's public pages needs a
  valid bearer token, checked on the request's head before any byte of its body is read: a
  client without one gets 401 at once, whatever body it announced or half-sent, and never
  reaches a parser (a malformed body without a token is 401, not 400).
* **A deadline on each read of the body.** While a request's body is incomplete, each wait
  for its next bytes may last ``body_timeout`` seconds; then the request is answered 408 and
  its connection closed. Everything the route held is released as for a client that went
  away (an upload's temporary file is removed). Only gaps count: a large upload that keeps
  sending is never cut, and once the body is complete (a log stream) nothing is timed.
* What is left of a body after an early answer (401, 413) is read and dropped, never
  buffered, for at most the keep-alive timeout, then the connection is closed
  (``connections``): a client that sends its whole body before reading the answer still
  gets it, if it sends within that time.

The head of a request (line and headers) has its own deadline in ``connections``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Callable

from elasticdl.server.auth import TokenStore
from elasticdl.server.errors import Unauthorized

CLOSE = (b"connection", b"close")


def public_path(method: str, path: str, prefix: str) -> bool:
    """The dashboard's pages (under ``prefix``, and ``/`` that redirects there): static files
    with no data, which the browser loads before it has asked for a token."""
    if method not in ("GET", "HEAD"):
        return False
    return path in ("/", prefix) or path.startswith(prefix + "/")


async def answer(send, status: int, reason: str, headers: list | None = None) -> None:
    """A ``{"detail": reason}`` response."""
    body = json.dumps({"detail": reason}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


class RequestGate:
    """ASGI middleware: the token checked on the head, then the body's reads timed."""

    def __init__(
        self,
        app,
        tokens: TokenStore,
        body_timeout: float,
        is_public: Callable[[str, str], bool],
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.body_timeout = body_timeout
        self.is_public = is_public

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = _first_of_each(scope["headers"])
        if not self.is_public(scope["method"], scope["path"]):
            try:
                self.tokens.user_of(headers.get(b"authorization", b"").decode("latin-1"))
            except Unauthorized as e:
                return await answer(send, 401, e.reason, [(b"www-authenticate", b"Bearer")])
        timed = _TimedBody(self.app, self.body_timeout, _has_body(headers))
        await timed(scope, receive, send)


def _first_of_each(headers: list[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    """The headers by name, the first of a repeated one (as Starlette's ``Request.headers``
    reads them, so the routes see the token checked here)."""
    first: dict[bytes, bytes] = {}
    for name, value in headers:
        first.setdefault(name, value)
    return first


def _has_body(headers: dict[bytes, bytes]) -> bool:
    return b"transfer-encoding" in headers or headers.get(b"content-length", b"0") != b"0"


class _TimedBody:
    """One request, its body's reads under the deadline."""

    def __init__(self, app, timeout: float, has_body: bool) -> None:
        self.app = app
        self.timeout = timeout
        self.body_done = not has_body
        self.response_started = False
        self.timed_out = False

    async def __call__(self, scope, receive, send):
        async def timed_receive():
            if self.body_done:
                return await receive()  # e.g. a streaming response waiting for a disconnect
            if self.timed_out:
                return {"type": "http.disconnect"}
            try:
                async with asyncio.timeout(self.timeout):  # no task per read, unlike wait_for
                    message = await receive()
            except TimeoutError:
                self.timed_out = True
                if not self.response_started:
                    self.response_started = True
                    await answer(
                        send,
                        408,
                        f"the request body stopped arriving (nothing for {self.timeout:g} s); "
                        "send the request again",
                        [CLOSE],  # the client has stopped sending: nothing to drop
                    )
                # The route sees a client that went away and cleans up as for one.
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                self.body_done = True
            return message

        async def checked_send(message):
            if self.timed_out:
                return  # the 408 is the answer
            if message["type"] == "http.response.start":
                self.response_started = True
            await send(message)

        try:
            await self.app(scope, timed_receive, checked_send)
        except Exception:
            if not self.timed_out:
                raise
            # What the route raised on finding its client gone; the 408 was the answer.
