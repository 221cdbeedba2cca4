"""How large a message a job's servers accept: what the job needs, not whatever gRPC allows.

Why: a server that takes 256 MiB per request lets one bad (or hostile but authenticated)
caller make it allocate and parse that much per call, and turns a bug that builds a giant
gradient into a slow death instead of a clear error. Each server therefore caps requests at
what its job can send, with headroom:

  master  task reports and status calls are small (`BASE_BYTES`); an evaluation report holds a
          task's model outputs and labels, so jobs that evaluate add `records_per_task` times
          `EVAL_BYTES_PER_RECORD`. gRPC itself enforces this (the server's receive limit).
  PS      before it holds a model, `TRANSPORT_MAX_BYTES` (the first push_model brings it);
          then twice its shard's dense bytes plus the embedding rows a minibatch can push
          (`minibatch_size` x `EMBEDDING_IDS_PER_RECORD` ids x the tables' widths), plus
          `BASE_BYTES`. Checked by `SizeCapInterceptor` on the request's bytes before they are
          parsed, and by the local push channel on each frame.

A refused request ends with RESOURCE_EXHAUSTED and a message naming the method, both sizes and
where the cap comes from.
"""
from __future__ import annotations

from typing import Callable, Iterable

import grpc

MIB = 1024 * 1024
TRANSPORT_MAX_BYTES = 256 * MIB  # gRPC's own limit on every server and channel of a job
BASE_BYTES = 4 * MIB
EVAL_BYTES_PER_RECORD = 64 * 1024  # 16k float32 outputs per record
EMBEDDING_IDS_PER_RECORD = 1024


def master_cap(records_per_task: int, evaluates: bool) -> int:
    """The master's receive limit for a job with tasks of `records_per_task` records."""
    need = BASE_BYTES + (records_per_task * EVAL_BYTES_PER_RECORD if evaluates else 0)
    return min(TRANSPORT_MAX_BYTES, need)


def ps_cap(dense_bytes: int, embedding_dims: Iterable[int], minibatch_size: int) -> int:
    """A PS's request limit once it holds a shard of `dense_bytes` dense bytes and embedding
    tables of widths `embedding_dims` (float32 rows plus an int64 id each)."""
    rows = minibatch_size * EMBEDDING_IDS_PER_RECORD * sum(4 * int(d) + 8 for d in embedding_dims)
    return min(TRANSPORT_MAX_BYTES, 2 * (int(dense_bytes) + rows) + BASE_BYTES)


def oversize_message(method: str, size: int, cap: int, why: str) -> str:
    return (
        f"{method}: a request of {size} bytes is over this job's cap of {cap} bytes ({why}); "
        "a model or minibatch this large needs a job sized for it"
    )


class _Oversize:
    """What the wrapped deserializer returns instead of parsing an oversized request."""

    def __init__(self, size: int, cap: int, why: str):
        self.size, self.cap, self.why = size, cap, why


def _capped(deserializer, limit: Callable[[], tuple[int, str]]):
    def parse(data: bytes):
        cap, why = limit()
        if len(data) > cap:
            return _Oversize(len(data), cap, why)
        return deserializer(data) if deserializer is not None else data

    return parse


def _refusing(behavior, method: str):
    def handle(request, context):
        if isinstance(request, _Oversize):
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                oversize_message(method, request.size, request.cap, request.why),
            )
        return behavior(request, context)

    return handle


class SizeCapInterceptor(grpc.ServerInterceptor):
    """For ``grpc.server``: refuse requests larger than ``limit()`` (a cap and where it comes
    from) before parsing them. Register after the token interceptor, so that only the job's
    own callers are measured at all."""

    def __init__(self, limit: Callable[[], tuple[int, str]]):
        self._limit = limit

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        method = handler_call_details.method.rpartition("/")[2]
        parse = _capped(handler.request_deserializer, self._limit)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                _refusing(handler.unary_stream, method),
                request_deserializer=parse,
                response_serializer=handler.response_serializer,
            )
        return grpc.unary_unary_rpc_method_handler(
            _refusing(handler.unary_unary, method),
            request_deserializer=parse,
            response_serializer=handler.response_serializer,
        )
