"""The push path to one PS: where a push's dense gradients go, how it is sent, and what happens
when that way fails.

A worker keeps one `PSLink` per PS. The link holds the PS's gRPC stub and, while the PS has
this worker's shared-memory region mapped, a `SharedMemoryLink` (the region, the id the PS gave
it, and the PS's local push channel when it offers one); with a PS it shares no memory with
(another host), a `StreamLink` instead when the PS offers its stream channel (the same frames
over TCP). A push goes one of four ways:

    in a message        the dense gradients inside the gRPC request
    region + gRPC       the gradients written into the region, the gRPC request names it
    region + channel    the same request over the local channel (elasticdl.common.local_channel)
    stream              the message's bytes over the stream channel instead of gRPC

A push that took a region falls back to a message in exactly two cases, and then only this PS's
push is sent again, once (the others may have been applied already). The message carries the
push's number (`push_id`): a PS that took the push before its answer was lost answers it again
without taking it twice.

  * The PS answers FAILED_PRECONDITION to a gRPC push naming the region: it was relaunched and
    knows no region.
  * The local channel breaks: the send fails, or the answer is UNAVAILABLE (connection gone) or
    FAILED_PRECONDITION (region gone).

Either way the link drops the region and attaches again at the next push. A push on the stream
falls back the same way when the stream breaks (the send fails, or the answer is UNAVAILABLE), and
the link opens the stream again at the next push.

A PS that refuses a region (on another host, a model that differs) keeps getting messages and
is asked again after ATTACH_RETRY_PUSHES pushes, then twice as many after each further refusal;
a stream channel that the PS does not offer or that cannot be reached, likewise.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import grpc
import numpy as np
from elasticdl.common import local_channel as lc
from elasticdl.common import push_wire
from elasticdl.common import shared_memory as shm
from elasticdl.common.push_wire import PushAnswer, decode_push_answer, encode_push
from elasticdl.common.tensor_utils import IndexedRows, ndarray_to_pb, tensor_bytes_to_ndarray
from elasticdl.ops import _backend
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.worker.grpc_utils import is_retryable

# Pushes framed and read by the native codec when elasticdl.ops loaded the extension.
push_wire.use_native(_backend.native)

logger = logging.getLogger(__name__)

# A PS that refused a shared-memory region (another host, no model yet) is asked again after
# this many pushes, doubling with each refusal (to ~100k pushes): a PS that came back with a
# model is picked up soon, while one on another host costs a region's allocation rarely.
ATTACH_RETRY_PUSHES = 100
ATTACH_MAX_DOUBLINGS = 10

# Answers on the local channel after which the push is sent again by gRPC: the connection is
# gone (UNAVAILABLE) or the PS no longer knows the region (FAILED_PRECONDITION). Any other error
# is the PS's verdict on the push itself and would be the same by gRPC.
CHANNEL_FALLBACK_CODES = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE)

# Pulls of several tables' rows on one connection are all sent before the first answer is read
# while the requests after the first total at most this: under a Unix socket's buffer and under
# Linux's default TCP receive buffer (128 KiB), so the PS can take them while it still writes a
# large first answer.
PIPELINED_PULL_MAX_BYTES = 64 * 1024

Entries = Tuple[Tuple[str, int, int, Tuple[int, ...]], ...]


@dataclass
class PushPart:
    """One PS's share of a push: its request without the dense and embedding gradients, those
    dense gradients, either by name or as one flat block laid out by `entries` (from the packed
    step), and its embedding gradients (table -> rows)."""

    request: pb.PushGradientsRequest
    dense: Optional[Mapping[str, np.ndarray]] = None
    block: Optional[np.ndarray] = None
    entries: Entries = ()
    embedding: Dict[str, IndexedRows] = field(default_factory=dict)

    def dense_by_name(self) -> Mapping[str, np.ndarray]:
        if self.dense is None:
            self.dense = shm.unpack_block(self.entries, self.block)
        return self.dense


@dataclass
class PushRequest:
    """A push as it is sent: the request message, and the embedding rows and dense gradients
    that its bytes carry besides (`SerializeToString` writes them without protobuf's copies:
    push_wire)."""

    message: pb.PushGradientsRequest
    embedding: Mapping[str, IndexedRows]
    dense: Mapping[str, np.ndarray] = field(default_factory=dict)

    def SerializeToString(self) -> bytes:
        return encode_push(self.message, self.embedding, self.dense)


def dense_to_message(grads: Mapping[str, np.ndarray], req: pb.PushGradientsRequest) -> None:
    for name, grad in grads.items():
        ndarray_to_pb(np.asarray(grad), req.gradients.dense_parameters[name])


@dataclass
class SharedMemoryLink:
    """A region this worker attached with one PS, the id that PS gave it, the PS's local push
    channel when it offers one and this worker could connect, and a second connection to that
    channel for pulls of embedding rows (opened on the first pull)."""

    region: shm.SharedRegion
    region_id: int
    channel: Optional[lc.LocalChannelClient] = None
    pull_channel: Optional[lc.LocalChannelClient] = None

    def pull_connection(self, timeout: float) -> lc.LocalChannelClient:
        """The connection for pulls, opened now if need be (raises LocalChannelError or
        OSError when the PS's channel cannot be reached)."""
        if self.pull_channel is None:
            self.pull_channel = lc.LocalChannelClient(
                self.channel.name, self.region_id, self.region.token, timeout
            )
        return self.pull_channel

    def write(self, part: PushPart, req: pb.PushGradientsRequest) -> bool:
        """Put `part`'s dense gradients into the region and name it in `req`; False (nothing
        written) when the region has no slot for one of them."""
        packed = self.region.packed()
        if part.block is not None and packed is not None and packed.entries == part.entries:
            np.copyto(packed.gradients, part.block)  # every slot in one copy
            req.shared_memory_region = self.region_id
            return True
        dense = part.dense_by_name()
        if dense.keys() <= self.region.slots.keys():
            missing = self.region.write_gradients(dense)
            req.shared_memory_region = self.region_id
            req.shared_memory_missing.extend(missing)
            return True
        return False

    def close(self) -> None:
        for channel in (self.channel, self.pull_channel):
            if channel is not None:
                channel.close()
        self.region.close()


# How long a worker waits for a stream channel to connect and admit it before staying on gRPC.
STREAM_CONNECT_TIMEOUT_S = 5.0


@dataclass
class StreamLink:
    """The stream channel of a PS this worker shares no memory with: a connection for pushes
    and a second one for pulls of embedding rows (opened on the first pull)."""

    host: str
    port: int
    ticket: bytes
    channel: lc.LocalChannelClient
    pull_channel: Optional[lc.LocalChannelClient] = None

    @classmethod
    def connect(cls, host: str, port: int, ticket: bytes, timeout: float) -> "StreamLink":
        return cls(host, port, ticket, cls._connection(host, port, ticket, timeout))

    @staticmethod
    def _connection(host: str, port: int, ticket: bytes, timeout: float) -> lc.LocalChannelClient:
        return lc.LocalChannelClient.over_tcp(
            host, port, ticket, timeout, connect_timeout=min(timeout, STREAM_CONNECT_TIMEOUT_S)
        )

    def pull_connection(self, timeout: float) -> lc.LocalChannelClient:
        if self.pull_channel is None:
            self.pull_channel = self._connection(self.host, self.port, self.ticket, timeout)
        return self.pull_channel

    def close(self) -> None:
        for channel in (self.channel, self.pull_channel):
            if channel is not None:
                channel.close()


class PSLink:
    """The worker's push path to one PS: its gRPC stub, the shared-memory link while attached,
    when to ask for one next, and the push in flight.

    A link sends only: the caller (`PSClient.push_gradients`) sends every PS's push before it
    waits for any answer, so that all PS work at once, and runs the gRPC calls of all links as
    one fan-out with one retry budget. One push per PS is in flight at a time, so the link
    keeps that push's state (`prepare_push` to `receive` / `in_message`) itself.

    Pulls of embedding rows take the link's channel too, on a connection of their own, so that
    a step's pulls do not wait for a push in flight (the trainer overlaps them with an async
    PS), and when it is free (no other thread's pull): a pull is read-only, so any failure on
    the channel sends that pull again by gRPC, which answers it authoritatively. A pull never
    drops the region itself (the step that pulls may be reading the region's parameters); a
    channel that failed mid-pull is dropped at the next push instead. A PS that does not
    answer pulls on its channel (one that predates them) gets them by gRPC from then on.
    """

    def __init__(self, ps_id: int, addr: str, stub, worker_id: int, rpc_timeout: float):
        self.ps_id = ps_id
        self.addr = addr
        self.stub = stub
        self.worker_id = worker_id
        self.rpc_timeout = rpc_timeout
        self.shared: Optional[SharedMemoryLink] = None
        self.attach_countdown = 0  # pushes until the next attach attempt
        self.attach_refusals = 0
        self.stream: Optional[StreamLink] = None
        self.stream_countdown = 0  # pushes until the next attempt to open the stream
        self.stream_refusals = 0
        # The link whose channel the push in flight went on (the region's or the stream).
        self._push_via: Optional[object] = None
        # The push in flight.
        self.request: Optional[pb.PushGradientsRequest] = None
        self._part: Optional[PushPart] = None
        # The dense gradients the push carries in its bytes (none while the region has them).
        self._dense_in_message: Mapping[str, np.ndarray] = {}
        self.on_channel = False
        self.sent = False
        self._answer_unread = False
        # Each connection carries one call at a time: a push holds the channel from `send` to
        # `end_push`, a pull the pulls' connection from `send_pull` to `receive_pull`.
        self._channel_lock = threading.Lock()
        self._pull_lock = threading.Lock()
        self._holds_channel = False
        self.pulls_on_channel = True  # False once the PS refused a pull there
        self._channel_suspect = False  # a pull failed on the channel: drop it at the next push
        # The pulls in flight: their connection, requests not sent yet, answers not read yet.
        self._pull_channel: Optional[lc.LocalChannelClient] = None
        self._pulls_unsent: List[bytes] = []
        self._pulls_unread = 0

    # ------------------------------------------------------------------ attaching
    def maybe_attach(self, tensors: Mapping[str, Tuple[np.dtype, Tuple[int, ...]]]) -> None:
        """Attach a region for `tensors` (this PS's dense parameters) unless attached or refused
        recently. Raises shm.SharedMemoryError when this host cannot create regions at all."""
        if self.shared is not None:
            return
        if self.attach_countdown > 0:
            self.attach_countdown -= 1
            return
        refusals = self.attach_refusals
        self.attach_countdown = ATTACH_RETRY_PUSHES << min(refusals, ATTACH_MAX_DOUBLINGS)
        if not tensors:
            return
        region = shm.SharedRegion.create(tensors, tag=f"w{self.worker_id}-ps{self.ps_id}")
        try:
            req = pb.AttachSharedMemoryRequest(
                worker_id=self.worker_id, path=region.path, size=region.size, token=region.token
            )
            shm.slots_to_pb(region.slots.values(), req.slots)
            try:
                resp = self.stub.attach_shared_memory(req, timeout=self.rpc_timeout)
            except grpc.RpcError as err:
                if is_retryable(err):
                    region.close()
                    self.attach_countdown = 0  # the PS is restarting: try next push
                    return
                resp = pb.AttachSharedMemoryResponse(attached=False, reason=err.details() or "")
        finally:
            region.unlink()  # both ends have mapped it (or never will): drop the name
        if resp.attached:
            channel = None
            if resp.local_channel:
                try:
                    channel = lc.LocalChannelClient(
                        resp.local_channel, resp.region_id, region.token, self.rpc_timeout
                    )
                except (OSError, grpc.RpcError) as e:
                    logger.info("PS %d: no local push channel (%s): pushes use gRPC", self.ps_id, e)
            self.shared = SharedMemoryLink(region, resp.region_id, channel)
            self.attach_refusals = 0
            self._close_stream()  # same host after all: the region's way wins
            logger.info(
                "PS %d (%s): dense gradients and parameters go through shared memory%s",
                self.ps_id,
                self.addr,
                ", pushes through a local channel" if channel is not None else "",
            )
        else:
            region.close()
            self.attach_refusals += 1
            logger.log(
                logging.INFO if refusals == 0 else logging.DEBUG,
                "PS %d (%s) cannot share memory with this worker (%s): dense tensors travel "
                "in messages (asking again in %d pushes)",
                self.ps_id,
                self.addr,
                resp.reason,
                self.attach_countdown,
            )

    def drop_shared(self) -> None:
        """Forget the region (the PS lost it or its channel broke) and attach at the next push."""
        shared, self.shared = self.shared, None
        if shared is not None:
            shared.close()
        self.attach_countdown = 0

    # ------------------------------------------------------------------ the stream channel
    def maybe_open_stream(self) -> None:
        """Open the PS's stream channel unless this worker shares memory with it, has the
        stream already, or was refused it recently (then it stays on gRPC)."""
        if self.shared is not None or self.stream is not None:
            return
        if self.stream_countdown > 0:
            self.stream_countdown -= 1
            return
        refusals = self.stream_refusals
        self.stream_countdown = ATTACH_RETRY_PUSHES << min(refusals, ATTACH_MAX_DOUBLINGS)
        try:
            resp = self.stub.open_stream_channel(
                pb.OpenStreamChannelRequest(worker_id=self.worker_id), timeout=self.rpc_timeout
            )
            reason = resp.reason
            if resp.port:
                host = lc.host_of(self.addr)
                self.stream = StreamLink.connect(host, resp.port, resp.ticket, self.rpc_timeout)
        except lc.LocalChannelError as err:  # the channel refused the ticket
            reason = f"{err.code().name}: {err.details()}"
        except grpc.RpcError as err:
            if is_retryable(err):
                self.stream_countdown = 0  # the PS is restarting: try at the next push
                return
            reason = f"{err.code().name}: {err.details()}"  # UNIMPLEMENTED: an older PS
        except OSError as err:
            reason = f"cannot connect: {err}"
        if self.stream is not None:
            self.stream_refusals = 0
            logger.info(
                "PS %d (%s): pushes and pulls go through its stream channel (port %d)",
                self.ps_id,
                self.addr,
                self.stream.port,
            )
            return
        self.stream_refusals += 1
        logger.log(
            logging.INFO if refusals == 0 else logging.DEBUG,
            "PS %d (%s): no stream channel (%s): pushes and pulls stay on gRPC "
            "(asking again in %d pushes)",
            self.ps_id,
            self.addr,
            reason,
            self.stream_countdown,
        )

    def drop_stream(self) -> None:
        """Forget the stream (it broke) and open it again at the next push."""
        self._close_stream()
        self.stream_countdown = 0

    def _close_stream(self) -> None:
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.close()

    def _channel_link(self):
        """The link whose channel pushes and pulls take: the region's (same host, when the PS
        offered its local channel) or the stream; None: gRPC only."""
        if self.shared is not None:
            return self.shared if self.shared.channel is not None else None
        return self.stream

    def _drop_channel_link(self, link) -> None:
        if link is not None and link is self.stream:
            self.drop_stream()
        else:
            self.drop_shared()

    def close(self) -> None:
        """Detach the region, if any, and close the stream; the gRPC channel belongs to the
        caller."""
        self._close_stream()
        shared, self.shared = self.shared, None
        if shared is None:
            return
        try:
            self.stub.detach_shared_memory(
                pb.DetachSharedMemoryRequest(region_id=shared.region_id), timeout=2.0
            )
        except grpc.RpcError:
            pass  # the PS is gone or old; it unmaps idle regions itself
        shared.close()

    # ------------------------------------------------------------------ one push
    def prepare_push(self, part: PushPart) -> PushRequest:
        """Route `part`'s dense gradients (the region when it fits them, else the message) and
        make its request this link's push in flight."""
        if self._channel_suspect:
            self._channel_suspect = False
            logger.warning("PS %d: its channel failed during a pull; connecting anew", self.ps_id)
            self._drop_channel_link(self._channel_link())
        req = part.request
        shared = self.shared
        self._dense_in_message = {}
        if shared is None or not shared.write(part, req):
            self._dense_in_message = part.dense_by_name()
        self.request, self._part = req, part
        if req.shared_memory_region:
            self._push_via = shared if shared.channel is not None else None
        else:  # in a message: by the stream when there is one (never beside a region)
            self._push_via = self.stream if shared is None else None
        self.on_channel = self._push_via is not None
        self.sent = False
        return self.in_flight()

    def in_flight(self) -> PushRequest:
        """The push in flight, to send."""
        return PushRequest(self.request, self._part.embedding, self._dense_in_message)

    def send(self) -> None:
        """Send the push on the local channel (only when `on_channel`); a channel that cannot
        take it leaves `sent` False, and the push goes by gRPC in a message instead."""
        if not self._holds_channel:
            self._channel_lock.acquire()
            self._holds_channel = True
        try:
            self._push_via.channel.send(lc.PUSH, self.in_flight().SerializeToString())
            self.sent = self._answer_unread = True
        except lc.LocalChannelError:
            self.sent = False

    def receive(self) -> Optional[PushAnswer]:
        """The answer to the push `send` put on the channel (its parameters: views of the frame
        received); None when it must be sent again in a message (`in_message`). Other errors are
        the PS's answer and propagate."""
        self._answer_unread = False
        try:
            return decode_push_answer(self._push_via.channel.receive())
        except lc.LocalChannelError as err:
            if err.code() not in CHANNEL_FALLBACK_CODES:
                raise
            logger.warning("PS %d local channel: %s; sending in a message", self.ps_id, err)
            return None

    def reissue(self, req: PushRequest, err: grpc.RpcError) -> Optional[PushRequest]:
        """After gRPC call `req` of this push failed with `err` (not UNAVAILABLE): the request to
        send instead, or None to raise `err`. Only a PS that lost the region gets one."""
        if (
            err.code() != grpc.StatusCode.FAILED_PRECONDITION
            or not req.message.shared_memory_region
        ):
            return None
        logger.warning("PS %d lost this worker's shared memory: %s", self.ps_id, err.details())
        return self.in_message()

    def in_message(self) -> PushRequest:
        """The push in flight as a plain message, after its region or channel failed; the region
        is dropped and attached again at the next push (a broken stream: opened again)."""
        self._drop_channel_link(self._push_via)
        self._push_via = None
        req = self.request
        req.ClearField("shared_memory_region")
        del req.shared_memory_missing[:]
        self._dense_in_message = self._part.dense_by_name()
        self.on_channel = False
        return self.in_flight()

    def end_push(self) -> None:
        """Forget the push in flight (its request may be large). When an error elsewhere cut
        the push short before its answer was read off the channel, that answer would be taken
        for the next push's while the PS still works in the region: the region and channel are
        dropped instead, and attached again at the next push."""
        if self._answer_unread:
            logger.warning("PS %d: push abandoned on its channel; connecting anew", self.ps_id)
            self._answer_unread = False
            self._drop_channel_link(self._push_via)
        self._push_via = None
        self.request = self._part = None
        self._dense_in_message = {}
        self.on_channel = self.sent = False
        if self._holds_channel:
            self._holds_channel = False
            self._channel_lock.release()

    # ------------------------------------------------------------------ pulls
    def may_pull_on_channel(self) -> bool:
        """Whether `send_pulls` could take pulls now (it may still refuse them): the caller
        builds their requests only then."""
        return (
            self._channel_link() is not None and self.pulls_on_channel and not self._channel_suspect
        )

    def send_pulls(self, requests: Sequence[pb.PullEmbeddingVectorsRequest]) -> bool:
        """Send pulls of embedding rows on the local channel (several tables' rows for the same
        ids: one round trip); False (nothing in flight) when the link has no channel free for
        them or the send failed: they then go by gRPC. After True, `receive_pulls` must follow.

        The requests after the first go out before the first answer is read only while they are
        small: the PS answers each before it reads the next, so a large request behind a large
        answer could fill both directions' socket buffers at once. Larger ones are sent one at
        a time, each after the previous answer."""
        if not self.may_pull_on_channel():  # a suspect channel is out of step until a push
            return False
        holder = self._channel_link()
        if not self._pull_lock.acquire(blocking=False):
            return False  # another thread's pull
        payloads = [r.SerializeToString() for r in requests]
        ahead = len(payloads)
        if sum(len(p) for p in payloads[1:]) > PIPELINED_PULL_MAX_BYTES:
            ahead = 1
        try:
            channel = holder.pull_connection(self.rpc_timeout)
            for payload in payloads[:ahead]:
                channel.send(lc.PULL, payload)
        except (OSError, grpc.RpcError) as err:
            logger.info("PS %d local channel, pull: %s; pulling by gRPC", self.ps_id, err)
            self._channel_suspect = True
            self._pull_lock.release()
            return False
        self._pull_channel = channel
        self._pulls_unsent = payloads[ahead:]
        self._pulls_unread = len(payloads)
        return True

    def receive_pulls(self) -> List[Optional[np.ndarray]]:
        """The rows answering each request of `send_pulls`, in order (read-only views of the
        received bytes); None for one that must go by gRPC instead."""
        answers: List[Optional[np.ndarray]] = []
        try:
            while self._pulls_unread and not self._channel_suspect:
                answers.append(self._receive_one_pull())
                self._pulls_unread -= 1
                if self._pulls_unsent and not self._channel_suspect:
                    self._pull_channel.send(lc.PULL, self._pulls_unsent.pop(0))
        except lc.LocalChannelError as err:  # sending the next one failed
            logger.info("PS %d local channel, pull: %s; pulling by gRPC", self.ps_id, err)
            self._channel_suspect = True
        finally:
            answers += [None] * self._pulls_unread  # not read: by gRPC
            self._pulls_unread = 0
            self._pulls_unsent = []
            self._pull_channel = None
            self._pull_lock.release()
        return answers

    def _receive_one_pull(self) -> Optional[np.ndarray]:
        try:
            return tensor_bytes_to_ndarray(self._pull_channel.receive())
        except lc.LocalChannelError as err:
            if err.code() in CHANNEL_FALLBACK_CODES:
                self._channel_suspect = True
            elif err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                # A PS that predates pulls on the channel (or a bad request, which gRPC will
                # refuse the same way): the link pulls by gRPC from now on.
                self.pulls_on_channel = False
            logger.info("PS %d local channel, pull: %s; pulling by gRPC", self.ps_id, err)
            return None
        except ValueError as err:  # bytes that are no Tensor: the channel is out of step
            self._channel_suspect = True
            logger.warning("PS %d local channel, pull: %s; pulling by gRPC", self.ps_id, err)
            return None
