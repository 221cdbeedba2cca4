"""local_channel's frames over a real socket pair: a payload given as pieces arrives as their
concatenation, small ones joined with the header, large ones in gathering writes that the
kernel takes part by part while the reader drains them."""

from __future__ import annotations

import socket
import struct
import threading
import time

import numpy as np
import pytest
from elasticdl.common import local_channel as lc


def _round_trip(payload, aligned: bool = False) -> tuple[int, bytes]:
    left, right = socket.socketpair()
    got: list = []
    reader = threading.Thread(target=lambda: got.append(lc.recv_frame(right, aligned=aligned)))
    reader.start()
    try:
        lc.send_frame(left, lc.OK, payload)
        reader.join(30)
        assert not reader.is_alive()
    finally:
        left.close()
        right.close()
    kind, data = got[0]
    if aligned:
        assert isinstance(data, np.ndarray) and data.dtype == np.uint8
        assert data.ctypes.data % 64 == 0 or not data.nbytes
    return kind, bytes(data)


@pytest.mark.parametrize("size", [0, 1, 64 * 1024, 64 * 1024 + 1, 3 * 1024 * 1024 + 5])
def test_pieces_arrive_as_their_concatenation(size):
    rng = np.random.default_rng(size)
    block = rng.standard_normal(size // 4 + 1).astype(np.float32)
    raw = block.tobytes()[:size]
    # bytes, an empty piece, a float32 array's view (not a byte format), a bytearray
    cut = size // 3
    pieces = [
        raw[:cut],
        b"",
        memoryview(np.frombuffer(raw[cut : 2 * cut], np.uint8)),
        bytearray(raw[2 * cut :]),
    ]
    assert _round_trip(pieces) == (lc.OK, raw)
    assert _round_trip(raw) == (lc.OK, raw)  # one bytes payload, as before
    assert _round_trip(pieces, aligned=True) == (lc.OK, raw)  # into a 64-byte aligned buffer


def test_the_client_reads_answers_into_aligned_buffers_and_raises_error_answers():
    server, inner = socket.socketpair()
    client = lc.LocalChannelClient.__new__(lc.LocalChannelClient)
    client.name, client._sock = "test", inner
    try:
        for size in (0, 5, 70_000):
            lc.send_frame(server, lc.OK, bytes(range(256)) * (size // 256) + b"x" * (size % 256))
            got = client.receive()
            assert got.nbytes == size and (got.ctypes.data % 64 == 0 or not size)
            assert bytes(got[-1:]) == (b"x" if size else b"")
        lc.send_frame(server, lc.ERROR, lc.error_payload(lc.grpc.StatusCode.NOT_FOUND, "no such"))
        with pytest.raises(lc.LocalChannelError) as err:
            client.receive()
        assert err.value.code() == lc.grpc.StatusCode.NOT_FOUND and err.value.details() == "no such"
    finally:
        server.close()
        inner.close()


def test_an_array_view_piece_is_sent_as_its_bytes():
    values = np.arange(40_000, dtype=np.float32)  # 160 KB: the gathering write
    kind, data = _round_trip([b"head", memoryview(values)])
    assert kind == lc.OK and data == b"head" + values.tobytes()


def test_with_kernel_timeouts_a_frame_arriving_in_parts_is_read_whole_and_silence_times_out():
    left, right = socket.socketpair()
    try:
        lc.kernel_timeouts(right, 0.5)
        assert right.gettimeout() is None  # blocking: one read per frame
        payload = np.arange(300_000, dtype=np.float32).tobytes()  # 1.2 MB
        frame = struct.pack("<IB", len(payload) + 1, lc.OK) + payload

        def send_in_parts():
            for start in range(0, len(frame), 400_000):
                left.sendall(frame[start : start + 400_000])
                time.sleep(0.05)

        sender = threading.Thread(target=send_in_parts)
        sender.start()
        kind, data = lc.recv_frame(right)
        sender.join(30)
        assert kind == lc.OK and bytes(data) == payload
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="timed out waiting for the peer"):
            lc.recv_frame(right)  # the peer sends nothing more
        assert 0.4 < time.monotonic() - started < 5
    finally:
        left.close()
        right.close()


def test_with_kernel_timeouts_a_peer_that_reads_nothing_fails_the_send():
    left, right = socket.socketpair()
    try:
        lc.kernel_timeouts(left, 0.3)
        with pytest.raises(TimeoutError, match="timed out sending to the peer"):
            lc.send_frame(left, lc.PUSH, [bytes(64 << 20)])  # more than the socket buffers
    finally:
        left.close()
        right.close()
