"""Channels and retries shared by the worker's master and PS clients."""
from __future__ import annotations

import logging
import time
from typing import Callable, TypeVar

import grpc
from elasticdl.common import auth, message_caps, tls

logger = logging.getLogger(__name__)

# The transport ceiling; each server caps requests lower, at what its job needs.
MAX_MESSAGE_BYTES = message_caps.TRANSPORT_MAX_BYTES
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Fail fast on a dead peer instead of waiting for TCP timeouts; retries below decide.
    ("grpc.enable_retries", 0),
    # A peer that restarts (a master resuming its job, a relaunched PS) is reconnected to
    # within a second: gRPC's default reconnect backoff grows to minutes, and meanwhile every
    # call fails at once with the last connection error.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

# UNAVAILABLE: the server is (re)starting or unreachable. Anything else is a real error.
RETRYABLE_CODES = (grpc.StatusCode.UNAVAILABLE,)

T = TypeVar("T")


def build_channel(
    addr: str, secret: str | None = None, tls_config: tls.TLS | None = None
) -> grpc.Channel:
    """A channel to a job's server; with the job's ``secret`` on every call (servers started
    by a job's master require it, see ``elasticdl.common.auth``), over mutual TLS when the job
    has certificates (``elasticdl.common.tls``)."""
    channel = tls.channel(addr, list(CHANNEL_OPTIONS), tls_config)
    return channel if secret is None else auth.authenticated_channel(channel, secret)


def is_retryable(err: BaseException) -> bool:
    return isinstance(err, grpc.RpcError) and err.code() in RETRYABLE_CODES


class Backoff:
    """Exponential backoff bounded by a total deadline (seconds)."""

    def __init__(self, timeout: float, first: float = 0.1, cap: float = 2.0):
        self.deadline = time.monotonic() + timeout
        self.delay = first
        self.cap = cap

    def sleep_or_give_up(self) -> bool:
        """Sleep before the next attempt; False when the deadline has passed."""
        now = time.monotonic()
        if now >= self.deadline:
            return False
        time.sleep(min(self.delay, self.deadline - now))
        self.delay = min(self.delay * 2, self.cap)
        return True


def call_with_retry(
    fn: Callable[[], T],
    what: str,
    timeout: float,
    on_unavailable: Callable[[float], None] | None = None,
) -> T:
    """Run `fn` retrying UNAVAILABLE until `timeout` seconds have passed; `on_unavailable`
    gets the seconds since the first failure before each retry."""
    backoff = Backoff(timeout)
    first_failure = None
    while True:
        try:
            return fn()
        except grpc.RpcError as err:
            if not is_retryable(err) or not backoff.sleep_or_give_up():
                raise
            logger.warning("%s: %s unavailable, retrying", what, err.details() or err.code())
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            if on_unavailable is not None:
                on_unavailable(now - first_failure)
