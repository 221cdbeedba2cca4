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
          `BASE_BYTES`. Checked by `CappedHandlers` on the request's bytes before they are
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


def capped_handler(
    handler: grpc.RpcMethodHandler | None, method: str, limit: Callable[[], tuple[int, str]]
) -> grpc.RpcMethodHandler | None:
    """`handler` with requests larger than ``limit()`` (read at each request) refused before
    they are parsed; streamed requests are passed as they are."""
    if handler is None or handler.request_streaming:
        return handler
    name = method.rpartition("/")[2]
    parse = _capped(handler.request_deserializer, limit)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            _refusing(handler.unary_stream, name),
            request_deserializer=parse,
            response_serializer=handler.response_serializer,
        )
    return grpc.unary_unary_rpc_method_handler(
        _refusing(handler.unary_unary, name),
        request_deserializer=parse,
        response_serializer=handler.response_serializer,
    )


class CappedHandlers(grpc.GenericRpcHandler):
    """For ``grpc.server``: the methods of generic `handlers` (the first that has a method wins,
    as in the server) with requests larger than ``limit()`` (a cap and where it comes from)
    refused before they are parsed.

    A server interceptor could do the same, but it runs on every call and builds the wrapped
    handler anew each time; here each method's is built on its first call and kept, since the
    handlers given answer by method name alone. The server's interceptors (the job's token)
    still run first, so only the job's own callers are measured at all."""

    def __init__(
        self, handlers: Iterable[grpc.GenericRpcHandler], limit: Callable[[], tuple[int, str]]
    ):
        self._handlers = tuple(handlers)
        self._limit = limit
        self._by_method: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, handler_call_details):
        method = handler_call_details.method
        wrapped = self._by_method.get(method)
        if wrapped is None:
            for generic in self._handlers:
                handler = generic.service(handler_call_details)
                if handler is not None:
                    break
            else:
                return None  # unknown method: not kept, so a caller cannot grow the table
            wrapped = self._by_method.setdefault(
                method, capped_handler(handler, method, self._limit)
            )
        return wrapped


class HandlerCollector:
    """Stands in for a server in a generated ``add_<Service>Servicer_to_server`` call, to get
    the service's handlers as generic ones (for `CappedHandlers`)."""

    def __init__(self) -> None:
        self.handlers: list[grpc.GenericRpcHandler] = []

    def add_generic_rpc_handlers(self, handlers) -> None:
        self.handlers.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers) -> None:
        self.handlers.append(grpc.method_handlers_generic_handler(service, handlers))
