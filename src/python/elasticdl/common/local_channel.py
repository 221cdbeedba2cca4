"""A same-host channel for pushes and embedding pulls between a worker and a PS: length-prefixed
frames over a Unix socket in the abstract namespace.

Why: once the dense model travels through shared memory (elasticdl.common.shared_memory), a
push is a message of a few hundred bytes, and most of its round trip through grpcio is grpc's
own Python layer (a poller thread handing the call to a pool thread, HTTP/2 framing). A Unix
socket round trip costs a fraction of that, and the PS answers on the connection's own thread
(figures: benchmarks/runtime/README.md).

The PS offers the channel in its answer to `attach_shared_memory`; the worker connects and
proves it holds the region (its id and token in the first frame). Pushes naming that region and
pulls of embedding rows use the channel; everything else stays on gRPC. A pull of rows is the
same kind of small request (a batch's ids) as a push, and pays grpcio's per-call cost the same
way: a sparse model makes one per Embedding layer and minibatch, in series with the step.
The socket lives in the abstract namespace (no file to clean up), which belongs to the network
namespace: a worker in another pod cannot reach it, and does not try, since it could not attach
the region either.

A worker on another host gets the same frames over TCP instead (a "stream channel"): the PS
offers a port and a ticket in its answer to `open_stream_channel`, a gRPC call the job's secret
authenticates, and the connection's HELLO carries that ticket instead of a region. Pushes then
carry their dense gradients inline, as a gRPC message does, and name no region. grpcio's own
Python costs several times a framed round trip over the same TCP (benchmarks/ps/README.md).
The PS offers no stream to a job with TLS certificates (the frames are not encrypted), nor with
ELASTICDL_STREAM_CHANNEL=0 on either side.

Frames: 4-byte little-endian length, then one kind byte, then the payload:
  client -> PS   HELLO   region id (8 bytes LE) + token; over TCP: the ticket
                 PUSH    serialized PushGradientsRequest
                 PULL    serialized PullEmbeddingVectorsRequest
  PS -> client   OK      serialized response (empty for HELLO; a PULL's: the rows as a
                         serialized Tensor, as the gRPC call answers)
                 ERROR   grpc status code (1 byte) + UTF-8 message
Errors keep gRPC's status codes so the worker handles them exactly as gRPC errors
(`LocalChannelError` is a `grpc.RpcError` with `code()` and `details()`).
"""
from __future__ import annotations

import os
import socket
import struct
from typing import List, Mapping, Optional, Tuple, Union

import grpc
import numpy as np
from elasticdl.common.tensor_utils import aligned_empty

HELLO, PUSH, OK, ERROR, PULL = 1, 2, 3, 4, 5
MAX_FRAME_BYTES = (
    256 * 1024 * 1024
)  # the transport ceiling of gRPC messages; the PS caps pushes lower
_HEAD = struct.Struct("<IB")  # the length (kind byte included), then the kind
# A frame's payload: bytes-like, or a list of bytes-like pieces (see send_frame).
Payload = Union[bytes, bytearray, memoryview, List]
# Status codes by value (grpc.StatusCode members carry (value, name) tuples).
_CODES = {code.value[0]: code for code in grpc.StatusCode}


class LocalChannelError(grpc.RpcError):
    """An error answer, or a broken connection (UNAVAILABLE), shaped like a gRPC error."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def __str__(self) -> str:
        return f"{self._code.name}: {self._details}"


STREAM_ENV_SWITCH = "ELASTICDL_STREAM_CHANNEL"


def stream_enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether the stream channel may be used (on unless ELASTICDL_STREAM_CHANNEL is 0/false)."""
    environ = os.environ if environ is None else environ
    return environ.get(STREAM_ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def host_of(addr: str) -> str:
    """The host of a ``host:port`` address (an IPv6 literal without its brackets)."""
    host = addr.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def abstract_address(name: str) -> str:
    """`name` as Python spells an abstract-namespace address (a leading NUL byte)."""
    return "\0" + name


# Payloads up to this size are joined with their header and go out in one write; larger ones go
# in gathering writes (sendmsg) beside their header, so that they are not copied into a
# concatenation first.
_JOIN_MAX_BYTES = 64 * 1024


def send_frame(sock: socket.socket, kind: int, payload: Payload = b"") -> None:
    """One frame; `payload` is bytes-like, or a list of bytes-like pieces sent as their
    concatenation (a large one in one gathering write, without being joined first)."""
    pieces = payload if isinstance(payload, list) else [payload]
    size = sum(memoryview(p).nbytes for p in pieces)
    head = _HEAD.pack(size + 1, kind)
    try:
        if size <= _JOIN_MAX_BYTES:
            sock.sendall(b"".join([head, *pieces]))
        else:
            _send_pieces(sock, [head, *pieces])
    except BlockingIOError:  # the kernel's send timeout (kernel_timeouts)
        raise TimeoutError("timed out sending to the peer") from None


def _send_pieces(sock: socket.socket, pieces: List) -> None:
    views = [v for v in (memoryview(p).cast("B") for p in pieces) if v.nbytes]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= views[0].nbytes:
            sent -= views.pop(0).nbytes
        if sent:
            views[0] = views[0][sent:]


def _recv_into(sock: socket.socket, buf):
    view = memoryview(buf)
    got, n = 0, len(buf)
    while got < n:
        # A blocking socket returns once all of it arrived (or its kernel timeout passed):
        # one call per frame, not one per chunk the kernel has ready.
        try:
            k = sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
        except BlockingIOError:  # the kernel's receive timeout (kernel_timeouts)
            raise TimeoutError("timed out waiting for the peer") from None
        if k == 0:
            raise ConnectionError("the peer closed the channel")
        got += k
    return buf


def kernel_timeouts(sock: socket.socket, seconds: float) -> None:
    """Put `sock` in blocking mode with `seconds` as the kernel's send and receive timeouts.
    Python's own timeout makes the socket non-blocking and polls before every read, so a large
    frame costs a poll and a read per chunk the kernel has ready; this way it is read in one
    call, and a peer silent for `seconds` still fails the call (TimeoutError)."""
    sock.settimeout(None)
    whole = int(seconds)
    timeval = struct.pack("@ll", whole, int((seconds - whole) * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)


def recv_frame(
    sock: socket.socket, max_bytes: int = MAX_FRAME_BYTES, aligned: bool = False
) -> Tuple[int, Union[bytearray, np.ndarray]]:
    """A frame's kind and payload, read into the buffer returned (no copy after the read): a
    bytearray, or with `aligned` an uninitialised uint8 array that starts at a 64-byte boundary
    (a packed answer's parameters in it are aligned as TensorFlow takes them)."""
    n, kind = _HEAD.unpack(_recv_into(sock, bytearray(_HEAD.size)))
    if not 1 <= n <= max_bytes:
        raise ConnectionError(f"bad frame length {n}")
    buf = aligned_empty(n - 1, np.uint8) if aligned else bytearray(n - 1)
    return kind, _recv_into(sock, buf)


def error_payload(code: grpc.StatusCode, message: str) -> bytes:
    return bytes((code.value[0],)) + message.encode("utf-8", "replace")


def raise_error_payload(payload: bytes) -> None:
    code = _CODES.get(payload[0] if payload else -1, grpc.StatusCode.UNKNOWN)
    raise LocalChannelError(code, payload[1:].decode("utf-8", "replace"))


class LocalChannelClient:
    """The worker's end: one connection to one PS, used by one thread at a time."""

    def __init__(self, name: str, region_id: int, token: bytes, timeout: float = 120.0):
        self.name = name
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._open(abstract_address(name), struct.pack("<Q", region_id) + token, timeout)
        kernel_timeouts(self._sock, timeout)

    @classmethod
    def over_tcp(
        cls,
        host: str,
        port: int,
        ticket: bytes,
        timeout: float = 120.0,
        connect_timeout: Optional[float] = None,
    ) -> "LocalChannelClient":
        """A connection to a PS's stream channel (its `open_stream_channel` answer); connecting
        and being admitted may take `connect_timeout` (default: `timeout`)."""
        self = cls.__new__(cls)
        self.name = f"{host}:{port}"
        first = timeout if connect_timeout is None else connect_timeout
        self._sock = socket.create_connection((host, port), timeout=first)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._open(None, ticket, first)
        kernel_timeouts(self._sock, timeout)
        return self

    def _open(self, address, hello: bytes, timeout: float) -> None:
        try:
            self._sock.settimeout(timeout)
            if address is not None:
                self._sock.connect(address)
            self.call(HELLO, hello)
        except Exception:
            self._sock.close()
            raise

    def send(self, kind: int, payload: bytes) -> None:
        """First half of a call: lets a caller send to several PS before reading any answer."""
        try:
            send_frame(self._sock, kind, payload)
        except OSError as e:
            raise LocalChannelError(grpc.StatusCode.UNAVAILABLE, f"channel {self.name}: {e}")

    def receive(self) -> np.ndarray:
        """The payload of the PS's answer, in a uint8 array that starts at a 64-byte boundary;
        an ERROR answer raises."""
        try:
            kind, payload = recv_frame(self._sock, aligned=True)
        except (OSError, ConnectionError) as e:
            raise LocalChannelError(grpc.StatusCode.UNAVAILABLE, f"channel {self.name}: {e}")
        if kind == ERROR:
            raise_error_payload(bytes(payload))
        if kind != OK:
            raise LocalChannelError(grpc.StatusCode.INTERNAL, f"unexpected frame kind {kind}")
        return payload

    def call(self, kind: int, payload: bytes) -> np.ndarray:
        self.send(kind, payload)
        return self.receive()

    def close(self) -> None:
        self._sock.close()
