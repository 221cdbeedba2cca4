"""How many connections the job server holds, and how long one may take to say what it wants.

uvicorn gives the caps it has (``uvicorn_settings``):

* ``limit_concurrency``: at most ``max_connections`` connections (idle keep-alive ones and
  log streams included); a request arriving beyond them is answered 503.
* ``timeout_keep_alive``: an idle connection between requests is closed after a few seconds.
* h11's limit on a request's head (16 KiB); a longer one is answered 400 and closed.
* no WebSocket upgrades (the API has none), so every connection stays under these rules.

What uvicorn lacks is a deadline on the head itself: a client that connects and sends nothing,
or a header line now and then, would hold its connection (and one of ``max_connections``)
forever. ``BoundedH11Protocol`` closes it with a 408 after ``header_timeout`` seconds from
the connection (or from the first byte of a next request on a kept-alive connection) until
the head is complete. The body has its deadline in ``request_gate``.

Nor does uvicorn bound a connection answered before its body was complete (401 without a
token, 413): it reads and drops the rest of the body (no memory) for as long as the client
sends it. ``BoundedH11Protocol`` lets it do that for at most ``keep_alive_timeout`` seconds
(so a client that writes its whole body before reading still gets the answer), then closes.
"""

from __future__ import annotations

import functools
from typing import Any

import h11  # pants: no-infer-dep (uvicorn's HTTP/1.1 parser, installed with it)
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_HEAD_BYTES = 16 * 1024  # h11's default, named here because the deploy docs promise it


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's head, and on dropping the
    rest of a body already answered."""

    def __init__(self, *args: Any, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self._head_timer = None
        self._drop_timer = None
        self._dropping = None  # the request cycle whose body is being dropped

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # a head begun, not yet complete
            if self._head_timer is None:
                self._await_head()
        else:
            self._cancel_head_timer()
        if self._drop_timer is not None and (
            self.cycle is not self._dropping or self.conn.their_state is not h11.SEND_BODY
        ):
            self._cancel_drop_timer()  # the body ended in time; the connection goes on

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            # Answered early: uvicorn drops the rest of the body as it comes, until this.
            self._dropping = self.cycle
            self._drop_timer = self.loop.call_later(self.timeout_keep_alive, self._close)

    def connection_lost(self, exc) -> None:
        self._cancel_head_timer()
        self._cancel_drop_timer()
        super().connection_lost(exc)

    def _cancel_drop_timer(self) -> None:
        if self._drop_timer is not None:
            self._drop_timer.cancel()
            self._drop_timer = None
            self._dropping = None

    def _close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def _await_head(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        # Written by hand: h11 answers only a request whose head it has read.
        reason = (
            f"the request's line and headers did not arrive within {self.header_timeout:g} s; "
            "send the request again\n"
        ).encode()
        self.transport.write(
            b"HTTP/1.1 408 Request Timeout\r\n"
            b"content-type: text/plain; charset=utf-8\r\n"
            b"connection: close\r\n"
            b"content-length: " + str(len(reason)).encode() + b"\r\n\r\n" + reason
        )
        self.transport.close()


def uvicorn_settings(
    max_connections: int, header_timeout: float, keep_alive_timeout: float
) -> dict[str, Any]:
    """The ``uvicorn.Config`` keywords that bound connections (see the module's docstring)."""
    return {
        "http": functools.partial(BoundedH11Protocol, header_timeout=header_timeout),
        "ws": "none",
        "limit_concurrency": max_connections,
        "timeout_keep_alive": keep_alive_timeout,
        "h11_max_incomplete_event_size": MAX_HEAD_BYTES,
    }
