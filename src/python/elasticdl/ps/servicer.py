"""gRPC `Pserver` service: a thin translation layer over `ParameterServer`.

Errors a caller can fix (`PSError`) become INVALID_ARGUMENT / NOT_FOUND with the one-line
message; anything else is logged with its traceback and reported as INTERNAL.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
from typing import Callable, Mapping

import grpc
import numpy as np
from elasticdl.common import local_channel as lc
from elasticdl.common import push_wire
from elasticdl.common import shared_memory as shm
from elasticdl.common import tensor_utils as tu
from elasticdl.common.push_wire import DecodedPush, DensePull, decode_push, push_answer_pieces
from elasticdl.ops import _backend
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc
from elasticdl.ps.checkpointer import Checkpointer
from elasticdl.ps.errors import NotFoundError, PSError, RegionNotAttachedError
from elasticdl.ps.local_channel_server import LocalChannelServer
from elasticdl.ps.shared_regions import SharedRegions
from elasticdl.ps.updater import ParameterServer
from google.protobuf import empty_pb2

# Pushes framed and read by the native codec when elasticdl.ops loaded the extension.
push_wire.use_native(_backend.native)

logger = logging.getLogger(__name__)

MAX_STREAM_MESSAGE_BYTES = 4 * 1024 * 1024


def default_rows_per_message(dim: int) -> int:
    """Rows per streamed IndexedSlices so that one message stays under 4 MiB."""
    return max(1, (MAX_STREAM_MESSAGE_BYTES - 1024) // (dim * 4 + 8))


def checkpoint_dir_within(requested: str, job_dir: str) -> str | None:
    """The directory a save_checkpoint request may write to: the job's checkpoint directory
    or one below it (None: the job's own). Any caller that reaches the PS could otherwise
    make it write (and, with keep_checkpoint_max, delete version directories) anywhere the
    PS can."""
    if not requested:
        return None
    if not job_dir:
        raise PSError(
            "save_checkpoint: this PS has no --checkpoint_dir, so it takes no directory from "
            "the request; start the PS with --checkpoint_dir"
        )
    root = os.path.realpath(job_dir)
    target = os.path.realpath(os.path.join(root, requested))
    if os.path.commonpath([root, target]) != root:
        raise PSError(
            f"save_checkpoint: {requested!r} is outside the job's checkpoint directory "
            f"{job_dir}; give a directory inside it (or none)"
        )
    return target


def _status_for(error: Exception) -> grpc.StatusCode:
    if isinstance(error, NotFoundError):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(error, RegionNotAttachedError):
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.INVALID_ARGUMENT


def _rpc(method):
    @functools.wraps(method)
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except PSError as e:
            context.abort(_status_for(e), str(e))
        except Exception as e:  # noqa: BLE001 - the client must get a status, not a hang
            logger.exception("PS %d: %s failed", self.ps.params.ps_id, method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")

    return wrapper


def wire_handlers(servicer: "PserverServicer") -> grpc.GenericRpcHandler:
    """Handlers that take precedence over the generated ones (register them first): the pull of
    embedding rows answers with Tensor bytes it serialized itself, one copy of the rows instead
    of three, and a push's embedding gradients are read as views of the request's bytes
    (elasticdl.common.push_wire) instead of two copies (figures: benchmarks/ps/README.md)."""
    pull = grpc.unary_unary_rpc_method_handler(
        servicer.pull_embedding_vectors_bytes,
        request_deserializer=pb.PullEmbeddingVectorsRequest.FromString,
        response_serializer=None,  # the handler's bytes as they are
    )
    push = grpc.unary_unary_rpc_method_handler(
        servicer.push_gradients_decoded,
        request_deserializer=decode_push,
        response_serializer=None,  # the handler's bytes as they are
    )
    return grpc.method_handlers_generic_handler(
        "elasticdl.Pserver", {"pull_embedding_vectors": pull, "push_gradients": push}
    )


class PserverServicer(pb_grpc.PserverServicer):
    def __init__(
        self,
        ps: ParameterServer,
        checkpointer: Checkpointer | None = None,
        regions: SharedRegions | None = None,
        request_cap: Callable[[], tuple[int, str]] | None = None,
        stream_host: str | None = None,
    ):
        """`stream_host`: where the stream channel listens (the PS's bind host); None offers
        none (a job with TLS certificates: its frames are not encrypted)."""
        self.ps = ps
        self.stream_host = stream_host
        self._stream_channel: LocalChannelServer | None = None
        self._stream_failed = ""
        self.request_cap = request_cap  # for the local channel's pushes (gRPC: CappedHandlers)
        self.checkpointer = checkpointer
        self.regions = regions if regions is not None else SharedRegions()
        self._channel_lock = threading.Lock()
        self._local_channel: LocalChannelServer | None = None
        self._channel_failed = False

    @_rpc
    def push_model(self, request: pb.Model, context):
        self.ps.push_model(request)
        return empty_pb2.Empty()

    @_rpc
    def push_embedding_table_infos(self, request: pb.Model, context):
        self.ps.push_embedding_table_infos(request)
        return empty_pb2.Empty()

    @_rpc
    def pull_dense_parameters(self, request: pb.PullDenseParametersRequest, context):
        return self.ps.pull_dense(int(request.version), request.include_state)

    @_rpc
    def pull_embedding_vectors(self, request: pb.PullEmbeddingVectorsRequest, context):
        return pb.Tensor.FromString(self._rows_bytes(request))

    @_rpc
    def pull_embedding_vectors_bytes(self, request: pb.PullEmbeddingVectorsRequest, context):
        """The rows as a serialized Tensor, written with one copy (see `wire_handlers`)."""
        return self._rows_bytes(request)

    def _rows_bytes(self, request: pb.PullEmbeddingVectorsRequest) -> bytes:
        if not request.HasField("ids"):
            raise PSError("PullEmbeddingVectorsRequest.ids is missing")
        ids = tu.pb_to_ndarray(request.ids).reshape(-1)
        return tu.ndarray_to_tensor_bytes(self.ps.pull_embedding_vectors(request.name, ids))

    @_rpc
    def push_gradients(self, request: pb.PushGradientsRequest, context):
        return self.handle_push(request)

    @_rpc
    def push_state(self, request: pb.Model, context):
        result = self.ps.push_state(request)
        return pb.PushStateResponse(accepted=result.accepted, version=result.version)

    @_rpc
    def push_gradients_decoded(self, push: DecodedPush, context) -> bytes:
        """A push read by `decode_push`, answered with the pulled parameters written with one
        copy and joined once more (gRPC sends one buffer; see `wire_handlers`)."""
        return b"".join(self.answer_push(push))

    def answer_push(self, push: DecodedPush) -> list:
        """A push read by `decode_push` (by gRPC or on a channel), answered as the pieces of its
        serialized bytes (`push_answer_pieces`: a channel sends them as they are); raises PSError
        for a bad request."""
        resp = pb.PushGradientsResponse()
        pull = None
        if push.request.pull_dense_parameters:
            pull = DensePull(resp.dense_parameters, packed=push.request.pull_dense_packed)
        self._apply_push(push.request, resp, pull, push.embedding, push.dense)
        return push_answer_pieces(resp, pull)

    def handle_push(
        self,
        request: pb.PushGradientsRequest,
        embedding: Mapping[str, tu.IndexedRows] | None = None,
        dense: Mapping[str, np.ndarray] | None = None,
    ) -> pb.PushGradientsResponse:
        """A push parsed by protobuf (`embedding`, `dense`: its gradients when read apart from
        `request`); raises PSError for a bad request."""
        resp = pb.PushGradientsResponse()
        pull_into = resp.dense_parameters if request.pull_dense_parameters else None
        return self._apply_push(request, resp, pull_into, embedding, dense)

    def _apply_push(self, request, resp, pull_into, embedding, dense) -> pb.PushGradientsResponse:
        region = None
        if request.shared_memory_region:
            region = self.regions.get(request.shared_memory_region)
        result = self.ps.push_gradients(request, pull_into, region, embedding, dense)
        if pull_into is not None:
            resp.dense_parameters.SetInParent()  # present even when nothing is newer
        resp.accepted = result.accepted
        resp.version = result.version
        return resp

    def pull_embedding_table(self, request: pb.PullEmbeddingTableRequest, context):
        try:
            ids, values = self.ps.embedding_table_snapshot(request.name)
        except PSError as e:
            context.abort(_status_for(e), str(e))
        dim = values.shape[1]
        step = int(request.max_rows_per_message) or default_rows_per_message(dim)
        if step < 0:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"max_rows_per_message must be >= 0, got {step}"
            )
        return self._stream_rows(ids, values, step)

    @staticmethod
    def _stream_rows(ids: np.ndarray, values: np.ndarray, step: int):
        for start in range(0, ids.shape[0], step):
            yield tu.indexed_rows_to_pb(
                tu.IndexedRows(values[start : start + step], ids[start : start + step])
            )

    @_rpc
    def attach_shared_memory(self, request: pb.AttachSharedMemoryRequest, context):
        """Map the worker's region if this PS can see it; `attached=false` with the reason
        otherwise (another host or container, no model yet, slots that do not fit)."""
        try:
            slots = shm.slots_from_pb(request.slots)
            self.ps.check_shared_slots(slots)
            region = shm.SharedRegion.attach(request.path, request.size, request.token, slots)
        except shm.SharedMemoryError as e:
            return pb.AttachSharedMemoryResponse(attached=False, reason=str(e))
        region_id = self.regions.add(region, int(request.worker_id))
        channel = self._local_channel_name()
        logger.info(
            "PS %d: worker %d attached shared memory (%d bytes, %d parameters)",
            self.ps.params.ps_id,
            request.worker_id,
            request.size,
            len(slots),
        )
        return pb.AttachSharedMemoryResponse(
            attached=True, region_id=region_id, local_channel=channel
        )

    def _local_channel_name(self) -> str:
        """The push channel's name, started on the first attach; "" if it cannot start."""
        with self._channel_lock:
            if self._local_channel is None and not self._channel_failed:
                try:
                    self._local_channel = LocalChannelServer(
                        self.regions,
                        self.answer_push,
                        self._rows_bytes,
                        _status_for,
                        f"ps{self.ps.params.ps_id}",
                        request_cap=self.request_cap,
                    )
                except OSError as e:  # no abstract sockets here: pushes stay on gRPC
                    logger.info("no local push channel (%s): pushes stay on gRPC", e)
                    self._channel_failed = True
            return self._local_channel.name if self._local_channel is not None else ""

    @_rpc
    def open_stream_channel(self, request: pb.OpenStreamChannelRequest, context):
        """The stream channel's port and a ticket for the worker's connections; port 0 and the
        reason when this PS offers none."""
        reason = ""
        if self.stream_host is None:
            reason = "this job's PS serve TLS, and the stream channel's frames are not encrypted"
        elif not lc.stream_enabled():
            reason = f"{lc.STREAM_ENV_SWITCH}=0 on the PS"
        else:
            with self._channel_lock:
                if self._stream_channel is None and not self._stream_failed:
                    try:
                        self._stream_channel = LocalChannelServer(
                            self.regions,
                            self.answer_push,
                            self._rows_bytes,
                            _status_for,
                            request_cap=self.request_cap,
                            tcp_host=self.stream_host,
                        )
                        logger.info(
                            "PS %d: stream channel on %s",
                            self.ps.params.ps_id,
                            self._stream_channel.name,
                        )
                    except OSError as e:
                        self._stream_failed = f"the stream channel cannot listen: {e}"
                        logger.info("PS %d: %s", self.ps.params.ps_id, self._stream_failed)
                channel = self._stream_channel
            if channel is not None:
                return pb.OpenStreamChannelResponse(
                    port=channel.port, ticket=channel.issue_ticket()
                )
            reason = self._stream_failed
        return pb.OpenStreamChannelResponse(port=0, reason=reason)

    def close(self) -> None:
        """Stop the channels and unmap every region (the gRPC server is stopped)."""
        with self._channel_lock:
            channels = (self._local_channel, self._stream_channel)
            self._local_channel = self._stream_channel = None
        for channel in channels:
            if channel is not None:
                channel.close()
        self.regions.close()

    @_rpc
    def detach_shared_memory(self, request: pb.DetachSharedMemoryRequest, context):
        self.regions.remove(int(request.region_id))
        return empty_pb2.Empty()

    @_rpc
    def save_checkpoint(self, request: pb.SaveCheckpointRequest, context):
        if self.checkpointer is None:
            raise PSError("this PS has no checkpointer configured")
        directory = checkpoint_dir_within(
            request.checkpoint_dir, self.checkpointer.config.checkpoint_dir
        )
        model = self.ps.snapshot()
        if request.as_version:
            model.version = request.as_version
        path = self.checkpointer.save(model, directory)
        return pb.SaveCheckpointResponse(version=model.version, path=path)
