"""The PS's end of the same-host push channel, and of the stream channel that carries the same
frames over TCP to workers on other hosts (see elasticdl.common.local_channel).

One thread accepts connections, one thread per connection answers its pushes and pulls in
order: a worker has at most one call in flight per PS on it, so the connection's thread is all
it needs, and the call runs on it directly (no hand-off to a pool, unlike a gRPC call). The model lock in
`ParameterServer` orders these pushes with the gRPC ones.
"""
from __future__ import annotations

import collections
import hashlib
import hmac
import logging
import os
import secrets
import socket
import struct
import threading
from typing import Callable, Optional, Set, Tuple

import grpc
from elasticdl.common import local_channel as lc
from elasticdl.common import message_caps, push_wire
from elasticdl.common.push_wire import DecodedPush, decode_push
from elasticdl.ops import _backend
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.ps.errors import PSError
from elasticdl.ps.shared_regions import SharedRegions
from google.protobuf.message import DecodeError

# Pushes framed and read by the native codec when elasticdl.ops loaded the extension.
push_wire.use_native(_backend.native)

logger = logging.getLogger(__name__)

# Before a peer has shown a region's token it gets a small frame, a short time and a bounded
# number of connections: an abstract socket can be reached by any process on the host.
HELLO_MAX_BYTES = 4096
HELLO_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 1024
# Tickets a stream channel honours: the newest this many (a worker asks for one per connect).
MAX_TICKETS = 4096
TICKET_BYTES = 32


def _same_user(conn: socket.socket) -> bool:
    """Whether the connecting process runs as this PS's user (``SO_PEERCRED``): workers are
    the PS's siblings, started by the same master."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return False
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid == os.getuid()


class LocalChannelServer:
    def __init__(
        self,
        regions: SharedRegions,
        # a push read by `decode_push` -> its serialized PushGradientsResponse (lc.Payload)
        handle_push: Callable[[DecodedPush], lc.Payload],
        # PullEmbeddingVectorsRequest -> the rows as a serialized Tensor
        handle_pull: Callable[[pb.PullEmbeddingVectorsRequest], bytes],
        status_for: Callable[[Exception], grpc.StatusCode],
        tag: str = "",
        request_cap: Optional[Callable[[], Tuple[int, str]]] = None,
        tcp_host: Optional[str] = None,
    ):
        """With `tcp_host` (the PS's bind host): a stream channel on a free TCP port of it,
        whose connections show a ticket (`issue_ticket`) instead of a region."""
        self._regions = regions
        self._request_cap = request_cap
        self._handle_push = handle_push
        self._handle_pull = handle_pull
        self._status_for = status_for
        self.port: Optional[int] = None
        self._tickets: "collections.OrderedDict[bytes, None]" = collections.OrderedDict()
        if tcp_host is None:
            self.name = f"elasticdl-{tag + '-' if tag else ''}{os.getpid()}-{secrets.token_hex(8)}"
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(lc.abstract_address(self.name))
            self._listener.listen(128)
        else:
            host = tcp_host or "0.0.0.0"
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self._listener = socket.create_server((host, 0), family=family, backlog=128)
            self.port = self._listener.getsockname()[1]
            self.name = f"{host}:{self.port}"
        self._lock = threading.Lock()
        self._connections: Set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(
            target=self._accept_loop, name="ps-local-channel", daemon=True
        )
        self._thread.start()

    @property
    def over_tcp(self) -> bool:
        return self.port is not None

    def issue_ticket(self) -> bytes:
        """A ticket for one worker's connections to this stream channel."""
        ticket = secrets.token_bytes(TICKET_BYTES)
        with self._lock:
            self._tickets[hashlib.sha256(ticket).digest()] = None
            while len(self._tickets) > MAX_TICKETS:
                self._tickets.popitem(last=False)
        return ticket

    def _ticket_known(self, ticket: bytes) -> bool:
        # Looked up by digest: the time taken says nothing about a ticket's bytes.
        digest = hashlib.sha256(ticket).digest()
        with self._lock:
            return digest in self._tickets

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                if len(self._connections) >= MAX_CONNECTIONS or not (
                    self.over_tcp or _same_user(conn)
                ):
                    conn.close()
                    continue
                self._connections.add(conn)
            if self.over_tcp:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(
                target=self._serve, args=(conn,), name="ps-local-push", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            region_id = self._hello(conn)
            if region_id is None:
                return
            while True:
                kind, payload = lc.recv_frame(conn)
                lc.send_frame(conn, *self._answer(kind, payload, region_id))
        except (OSError, ConnectionError):
            pass  # the worker went away (or we are closing)
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def _hello(self, conn: socket.socket):
        conn.settimeout(HELLO_TIMEOUT_S)
        kind, payload = lc.recv_frame(conn, HELLO_MAX_BYTES)
        conn.settimeout(None)
        refusal = None
        region_id = 0  # a stream channel's pushes name no region
        if kind != lc.HELLO or len(payload) < 8:
            refusal = (grpc.StatusCode.INVALID_ARGUMENT, "the first frame must be HELLO")
        elif self.over_tcp:
            if not self._ticket_known(payload):
                refusal = (grpc.StatusCode.PERMISSION_DENIED, "unknown stream channel ticket")
        else:
            (region_id,) = struct.unpack_from("<Q", payload)
            try:
                region = self._regions.get(region_id)
            except PSError as e:
                refusal = (self._status_for(e), str(e))
            else:
                if not hmac.compare_digest(region.token, payload[8:]):
                    refusal = (grpc.StatusCode.PERMISSION_DENIED, "wrong region token")
        if refusal is not None:
            lc.send_frame(conn, lc.ERROR, lc.error_payload(*refusal))
            return None
        lc.send_frame(conn, lc.OK)
        return region_id

    def _answer(self, kind: int, payload: bytes, region_id: int):
        try:
            if kind not in (lc.PUSH, lc.PULL):
                raise PSError(f"frame kind {kind} is neither a push nor a pull")
            if self._request_cap is not None:
                cap, why = self._request_cap()
                if len(payload) > cap:
                    return lc.ERROR, lc.error_payload(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        message_caps.oversize_message(
                            "push_gradients" if kind == lc.PUSH else "pull_embedding_vectors",
                            len(payload),
                            cap,
                            why,
                        ),
                    )
            if kind == lc.PULL:
                try:
                    request = pb.PullEmbeddingVectorsRequest.FromString(bytes(payload))
                except DecodeError:
                    raise PSError("a pull frame must hold a PullEmbeddingVectorsRequest") from None
                return lc.OK, self._handle_pull(request)
            push = decode_push(payload)
            if push.request.shared_memory_region != region_id:
                raise PSError(
                    "a push on a stream channel carries its dense gradients and names no region"
                    if self.over_tcp
                    else "a push on this channel must name the channel's region"
                )
            return lc.OK, self._handle_push(push)
        except PSError as e:
            return lc.ERROR, lc.error_payload(self._status_for(e), str(e))
        except Exception as e:  # noqa: BLE001 - the worker must get an answer, not a hang
            logger.exception("local %s failed", "pull" if kind == lc.PULL else "push")
            return lc.ERROR, lc.error_payload(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._connections = list(self._connections), set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
