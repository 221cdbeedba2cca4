"""The stream channel: a worker that shares no memory with a PS pushes and pulls over the PS's
channel frames on TCP instead of gRPC. Real PS servers and clients on 127.0.0.1."""
import socket
import struct

import grpc
import numpy as np
import pytest
from elasticdl.common import local_channel as lc
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.ps.servicer import PserverServicer
from elasticdl.worker.ps_client import EmbeddingTableInfo, PSClient

DENSE = {"dense/kernel": np.linspace(-1, 1, 40, dtype=np.float32).reshape(4, 10)}
TABLES = [EmbeddingTableInfo("emb", 4, "uniform"), EmbeddingTableInfo("wide", 1, "zeros")]


def _client(cluster, stream: bool) -> PSClient:
    client = PSClient(cluster.addrs, retry_timeout=10, shared_memory=False, stream_channel=stream)
    client.push_model(DENSE, TABLES)
    client.pull_dense_parameters(force=True)
    return client


def _step(client: PSClient, step: int):
    rng = np.random.default_rng(step)
    ids = np.unique(rng.integers(0, 500, 64))
    rows = client.pull_rows_of_tables([("emb", 4), ("wide", 1)], ids, ids_unique=True)
    grads = {"dense/kernel": rng.standard_normal((4, 10)).astype(np.float32)}
    sparse = {
        "emb": (rng.standard_normal((ids.size, 4)).astype(np.float32), ids),
        "wide": (rng.standard_normal((ids.size, 1)).astype(np.float32), ids),
    }
    result = client.push_gradients(grads, sparse, learning_rate=0.1, pull_dense=True)
    return rows, result


@pytest.fixture
def grpc_calls(monkeypatch):
    """Pushes and pulls the PS served by gRPC (counted before the servers start)."""
    calls = []
    push, pull = (
        PserverServicer.push_gradients_decoded,
        PserverServicer.pull_embedding_vectors_bytes,
    )

    def counting_push(self, decoded, context):
        calls.append("push")
        return push(self, decoded, context)

    def counting_pull(self, request, context):
        calls.append("pull")
        return pull(self, request, context)

    monkeypatch.setattr(PserverServicer, "push_gradients_decoded", counting_push)
    monkeypatch.setattr(PserverServicer, "pull_embedding_vectors_bytes", counting_pull)
    return calls


@pytest.mark.parametrize("num_ps", [1, 2])
def test_pushes_and_pulls_take_the_stream_and_train_as_grpc_does(ps_cluster, grpc_calls, num_ps):
    cluster, twin = ps_cluster(num_ps), ps_cluster(num_ps)
    fast, slow = _client(cluster, True), _client(twin, False)
    for step in range(5):
        (rows_fast, got), (rows_slow, want) = _step(fast, step), _step(slow, step)
        for a, b in zip(rows_fast, rows_slow):
            np.testing.assert_array_equal(a, b)
        assert got.accepted and want.accepted and got.versions == want.versions
        for name in DENSE:
            np.testing.assert_array_equal(got.pulled.parameters[name], want.pulled.parameters[name])
    assert all(link.stream is not None for link in fast._links)
    # The twin's calls are all of gRPC's; of the fast client's, only the first step's pulls
    # (the stream opens at the first push, which takes it).
    assert grpc_calls.count("push") == 5 * num_ps
    assert grpc_calls.count("pull") == 2 * (5 * num_ps + num_ps)
    for a, b in zip(cluster.servers, twin.servers):
        assert a.params.version == b.params.version == 5
    fast.close()
    slow.close()


def test_the_stream_admits_only_a_ticket_holder_and_pushes_without_a_region(ps_cluster):
    cluster = ps_cluster(1)
    client = _client(cluster, True)
    _step(client, 0)
    stream = client._links[0].stream
    assert stream is not None
    with pytest.raises(lc.LocalChannelError) as refused:
        lc.LocalChannelClient.over_tcp("127.0.0.1", stream.port, b"\0" * 32, timeout=5)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # A ticket is bound to the PS that issued it.
    other = ps_cluster(1)
    other_client = _client(other, True)
    _step(other_client, 0)
    with pytest.raises(lc.LocalChannelError) as foreign:
        lc.LocalChannelClient.over_tcp(
            "127.0.0.1", other_client._links[0].stream.port, stream.ticket, timeout=5
        )
    assert foreign.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # Before its ticket a peer may send only a small first frame.
    with socket.create_connection(("127.0.0.1", stream.port), timeout=5) as s:
        s.sendall(struct.pack("<I", 200 * 1024 * 1024) + bytes([lc.HELLO]))
        try:
            answer = s.recv(1)
        except ConnectionResetError:
            answer = b""
        assert answer == b""  # closed without reading 200 MB
    version = cluster.servers[0].params.version
    naming = pb.PushGradientsRequest(shared_memory_region=7, worker_id=0)
    with pytest.raises(lc.LocalChannelError) as region:
        stream.channel.call(lc.PUSH, naming.SerializeToString())
    assert region.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "names no region" in region.value.details()
    assert cluster.servers[0].params.version == version
    _step(client, 1)  # the link's own connection carries on
    assert cluster.servers[0].params.version == version + 1
    client.close()
    other_client.close()


def test_a_broken_stream_sends_the_push_by_grpc_once_and_reopens(ps_cluster, grpc_calls):
    cluster = ps_cluster(1)
    client = _client(cluster, True)
    _step(client, 0)
    first = client._links[0].stream
    assert first is not None
    servicer = cluster.servers[0].servicer
    servicer._stream_channel.close()  # the PS side of the stream goes away
    servicer._stream_channel = None
    grpc_calls.clear()
    rows, result = _step(client, 1)
    # Its pulls and its push went by gRPC (the push once), and the push was taken once.
    assert result.accepted and cluster.servers[0].params.version == 2
    assert grpc_calls.count("push") == 1 and grpc_calls.count("pull") == 2
    _step(client, 2)  # opens the stream again
    stream = client._links[0].stream
    assert stream is not None and stream is not first and stream.port != first.port
    grpc_calls.clear()
    _step(client, 3)
    assert grpc_calls == [] and cluster.servers[0].params.version == 4
    client.close()


def test_switched_off_on_the_ps_or_the_worker_and_an_older_ps(ps_cluster, monkeypatch, caplog):
    cluster = ps_cluster(1)
    monkeypatch.setenv(lc.STREAM_ENV_SWITCH, "0")
    assert PSClient(cluster.addrs).stream_channel is False
    client = _client(cluster, True)  # asked, but the PS has the switch too
    caplog.set_level("INFO", logger="elasticdl.worker.ps_links")
    _step(client, 0)
    link = client._links[0]
    assert link.stream is None and link.stream_refusals == 1
    assert "ELASTICDL_STREAM_CHANNEL=0 on the PS" in caplog.text
    assert link.stream_countdown > 0  # asked again only after many pushes
    monkeypatch.delenv(lc.STREAM_ENV_SWITCH)
    link.stream_countdown = 0
    _step(client, 1)
    assert link.stream is not None
    client.close()
    # A PS that predates the stream answers UNIMPLEMENTED: the worker stays on gRPC.
    monkeypatch.delattr(PserverServicer, "open_stream_channel")
    old = ps_cluster(1)
    client = _client(old, True)
    _step(client, 0)
    assert client._links[0].stream is None and "UNIMPLEMENTED" in caplog.text
    assert old.servers[0].params.version == 1
    client.close()
