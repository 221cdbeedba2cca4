"""local_channel's frames over a real socket pair: a payload given as pieces arrives as their
concatenation, small ones joined with the header, large ones in gathering writes that the
kernel takes part by part while the reader drains them."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest
from elasticdl.common import local_channel as lc


def _round_trip(payload) -> tuple[int, bytes]:
    left, right = socket.socketpair()
    got: list = []
    reader = threading.Thread(target=lambda: got.append(lc.recv_frame(right)))
    reader.start()
    try:
        lc.send_frame(left, lc.OK, payload)
        reader.join(30)
        assert not reader.is_alive()
    finally:
        left.close()
        right.close()
    kind, data = got[0]
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


def test_an_array_view_piece_is_sent_as_its_bytes():
    values = np.arange(40_000, dtype=np.float32)  # 160 KB: the gathering write
    kind, data = _round_trip([b"head", memoryview(values)])
    assert kind == lc.OK and data == b"head" + values.tobytes()
