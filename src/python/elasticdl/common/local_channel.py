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

Frames: 4-byte little-endian length, then one kind byte, then the payload:
  client -> PS   HELLO   region id (8 bytes LE) + token
                 PUSH    serialized PushGradientsRequest
                 PULL    serialized PullEmbeddingVectorsRequest
  PS -> client   OK      serialized response (empty for HELLO; a PULL's: the rows as a
                         serialized Tensor, as the gRPC call answers)
                 ERROR   grpc status code (1 byte) + UTF-8 message
Errors keep gRPC's status codes so the worker handles them exactly as gRPC errors
(`LocalChannelError` is a `grpc.RpcError` with `code()` and `details()`).
"""
from __future__ import annotations

import socket
import struct
from typing import Tuple

import grpc

HELLO, PUSH, OK, ERROR, PULL = 1, 2, 3, 4, 5
MAX_FRAME_BYTES = (
    256 * 1024 * 1024
)  # the transport ceiling of gRPC messages; the PS caps pushes lower
_LEN = struct.Struct("<I")
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


def abstract_address(name: str) -> str:
    """`name` as Python spells an abstract-namespace address (a leading NUL byte)."""
    return "\0" + name


def send_frame(sock: socket.socket, kind: int, payload: bytes = b"") -> None:
    sock.sendall(_LEN.pack(len(payload) + 1) + bytes((kind,)) + payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("the peer closed the channel")
        got += k
    return bytes(buf)


def recv_frame(sock: socket.socket, max_bytes: int = MAX_FRAME_BYTES) -> Tuple[int, bytes]:
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if not 1 <= n <= max_bytes:
        raise ConnectionError(f"bad frame length {n}")
    frame = _recv_exact(sock, n)
    return frame[0], frame[1:]


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
        try:
            self._sock.settimeout(timeout)
            self._sock.connect(abstract_address(name))
            self.call(HELLO, struct.pack("<Q", region_id) + token)
        except Exception:
            self._sock.close()
            raise

    def send(self, kind: int, payload: bytes) -> None:
        """First half of a call: lets a caller send to several PS before reading any answer."""
        try:
            send_frame(self._sock, kind, payload)
        except OSError as e:
            raise LocalChannelError(grpc.StatusCode.UNAVAILABLE, f"channel {self.name}: {e}")

    def receive(self) -> bytes:
        try:
            kind, payload = recv_frame(self._sock)
        except (OSError, ConnectionError) as e:
            raise LocalChannelError(grpc.StatusCode.UNAVAILABLE, f"channel {self.name}: {e}")
        if kind == ERROR:
            raise_error_payload(payload)
        if kind != OK:
            raise LocalChannelError(grpc.StatusCode.INTERNAL, f"unexpected frame kind {kind}")
        return payload

    def call(self, kind: int, payload: bytes) -> bytes:
        self.send(kind, payload)
        return self.receive()

    def close(self) -> None:
        self._sock.close()
