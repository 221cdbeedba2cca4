"""Who may talk to a job's servers: the processes that hold the job's secret.

The master creates one random secret per job. Its replicas get it in the environment variable
``ELASTICDL_JOB_SECRET`` (locally from the master's process environment, which only the same
user can read; on Kubernetes from a Secret object the master owns). Every RPC of the master's
and the PS's gRPC servers must carry it in the ``x-elasticdl-job-token`` metadata entry, which
a server interceptor checks before the call reaches a servicer; calls without it, or with
another job's, end with ``UNAUTHENTICATED`` and touch no state. The secret also names the
AllReduce store's keys, so a process without it cannot read or overwrite a group's entries.
SECURITY.md describes what this protects and what it does not.
"""

from __future__ import annotations

import hmac
import os
import secrets
from typing import Any, Callable, Mapping

import grpc
from elasticdl.common.job_dir import write_atomically

JOB_SECRET_ENV = "ELASTICDL_JOB_SECRET"
TOKEN_METADATA_KEY = "x-elasticdl-job-token"
_SECRET_BYTES = 32


class MissingJobSecret(RuntimeError):
    """A replica was started without its job's secret."""


def new_job_secret() -> str:
    return secrets.token_hex(_SECRET_BYTES)


def job_secret_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The job's secret from ``$ELASTICDL_JOB_SECRET``; replicas cannot serve without it."""
    value = (os.environ if environ is None else environ).get(JOB_SECRET_ENV, "")
    if not value:
        raise MissingJobSecret(
            f"${JOB_SECRET_ENV} is not set: replicas are started by their job's master, which "
            "passes the job's secret"
        )
    return value


def write_secret_file(path: str | os.PathLike, secret: str) -> None:
    """Write ``secret`` to a file only its owner can read (created 0600, never wider)."""
    write_atomically(path, secret, mode=0o600)


def read_secret_file(path: str | os.PathLike) -> str:
    with open(path) as f:
        return f.read().strip()


def _token_of(metadata) -> str:
    for key, value in metadata or ():
        if key == TOKEN_METADATA_KEY:
            return value if isinstance(value, str) else value.decode()
    return ""


def _valid(token: str, secret: str) -> bool:
    return bool(token) and hmac.compare_digest(token.encode(), secret.encode())


def carries_secret(metadata, secret: str) -> bool:
    """Whether a call's metadata carries the job's secret (for servers that check it in their
    own handlers rather than through an interceptor)."""
    return _valid(_token_of(metadata), secret)


DENIED = "missing or wrong job token: only the job's own replicas may call this server"


def _deny(request: Any, context: grpc.ServicerContext) -> Any:
    context.abort(grpc.StatusCode.UNAUTHENTICATED, DENIED)


def _denial_handler(handler: grpc.RpcMethodHandler | None, deny: Callable) -> Any:
    if handler is None:  # unknown method: let gRPC answer UNIMPLEMENTED
        return None
    if handler.request_streaming or handler.response_streaming:
        raise NotImplementedError("job servers have unary methods only")
    return grpc.unary_unary_rpc_method_handler(
        deny,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class TokenServerInterceptor(grpc.ServerInterceptor):
    """For ``grpc.server``: let only calls carrying the job's secret through."""

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("a job server needs the job's secret")
        self._secret = secret

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if _valid(_token_of(handler_call_details.invocation_metadata), self._secret):
            return handler
        return _denial_handler(handler, _deny)


class _TokenClientInterceptor(grpc.UnaryUnaryClientInterceptor):
    def __init__(self, secret: str) -> None:
        self._entry = (TOKEN_METADATA_KEY, secret)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        metadata = list(client_call_details.metadata or ())
        metadata.append(self._entry)
        details = _CallDetails(
            client_call_details.method,
            client_call_details.timeout,
            metadata,
            client_call_details.credentials,
            client_call_details.wait_for_ready,
            client_call_details.compression,
        )
        return continuation(details, request)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression):
        self.method = method
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.compression = compression


def authenticated_channel(channel: grpc.Channel, secret: str) -> grpc.Channel:
    """``channel`` with the job's secret attached to every call."""
    if not secret:
        raise ValueError("a job client needs the job's secret")
    return grpc.intercept_channel(channel, _TokenClientInterceptor(secret))


def store_prefix(secret: str) -> str:
    """The AllReduce store's key prefix: derived from the secret, so only holders know it."""
    return hmac.new(secret.encode(), b"elasticdl-allreduce-store", "sha256").hexdigest()[:32]
