"""The same-host fast path: dense gradients and parameters through shared memory, against real
PS servers over real gRPC. The oracle is the ordinary message path on an identical cluster."""
import os

import numpy as np
import pytest
from elasticdl.common import shared_memory as shm
from elasticdl.worker.ps_client import PSClient

pytestmark = pytest.mark.skipif(shm.default_directory() is None, reason="needs /dev/shm")

PARAMS = {
    "conv/kernel": np.linspace(-1, 1, 3 * 3 * 4, dtype=np.float32).reshape(3, 3, 1, 4),
    "conv/bias": np.zeros(4, np.float32),
    "dense/kernel": np.linspace(0, 1, 40, dtype=np.float32).reshape(4, 10),
    "dense/bias": np.ones(10, np.float32),
    "out/kernel": np.full((10, 2), 0.5, np.float32),
}


def _client(cluster, shared: bool) -> PSClient:
    # The stream channel stays out of these: the slow client is the gRPC-message path.
    client = PSClient(cluster.addrs, retry_timeout=10, shared_memory=shared, stream_channel=False)
    client.push_model(PARAMS)
    client.pull_dense_parameters(force=True)
    client.set_dense_layout(PARAMS)
    return client


def _grads(step: int, rng) -> dict:
    grads = {n: rng.standard_normal(v.shape).astype(np.float32) for n, v in PARAMS.items()}
    if step == 2:
        del grads["dense/bias"]  # a parameter without a gradient this step
    return grads


def _train_both(fast: PSClient, slow: PSClient, steps: int, seed: int) -> None:
    """Push the same gradients through both clients; their pulled parameters must be equal."""
    rng = np.random.default_rng(seed)
    for step in range(steps):
        grads = _grads(step, rng)
        a = fast.push_gradients(grads, learning_rate=0.01, pull_dense=True)
        b = slow.push_gradients(grads, learning_rate=0.01, pull_dense=True)
        assert a.accepted and b.accepted and a.versions == b.versions
        assert a.pulled.parameters.keys() == b.pulled.parameters.keys() == PARAMS.keys()
        for name in PARAMS:
            np.testing.assert_array_equal(a.pulled.parameters[name], b.pulled.parameters[name])


def _region_fds():
    """This process's descriptors of region memfds (the mmap objects' own included)."""
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{shm.FILE_PREFIX}"):
                fds.append(int(fd))
        except OSError:
            pass
    return fds


@pytest.mark.parametrize("num_ps", [1, 3])
def test_shared_memory_trains_bit_identically_to_messages(ps_cluster, num_ps):
    config = dict(opt_type="Adam", opt_args="learning_rate=0.01;")
    fast_cluster, slow_cluster = ps_cluster(num_ps, **config), ps_cluster(num_ps, **config)
    fast, slow = _client(fast_cluster, True), _client(slow_cluster, False)
    _train_both(fast, slow, steps=5, seed=0)
    # The fast client really used shared memory with every PS that holds parameters.
    holders = sorted({fast.ps_of_param(n) for n in PARAMS})
    assert fast.shared_memory_ps() == holders and slow.shared_memory_ps() == []
    assert [len(s.servicer.regions) for s in fast_cluster.servers] == [
        int(i in holders) for i in range(num_ps)
    ]
    for f, s in zip(fast_cluster.servers, slow_cluster.servers):
        for name, value in s.params.dense.items():
            np.testing.assert_array_equal(f.params.dense[name], value)
    # The creator's descriptors are closed as soon as the PS opened its own.
    assert all(link.shared.region._fd is None for link in fast._links if link.shared)
    fast.close()
    slow.close()
    assert [len(s.servicer.regions) for s in fast_cluster.servers] == [0] * num_ps


def test_ps_that_lost_the_region_gets_that_one_push_again_in_a_message(ps_cluster):
    cluster = ps_cluster(3)
    client = _client(cluster, True)
    holders = sorted({client.ps_of_param(n) for n in PARAMS})
    assert len(holders) >= 2  # so that one PS keeps its region while another loses it
    grads = {n: np.ones_like(v) for n, v in PARAMS.items()}
    client.push_gradients(grads, learning_rate=0.1, pull_dense=True)
    assert client.shared_memory_ps() == holders
    lost, kept = holders[0], holders[1]
    cluster.servers[lost].servicer.regions.close()  # as a relaunched PS knows no region
    versions = [s.params.version for s in cluster.servers]
    result = client.push_gradients(grads, learning_rate=0.1, pull_dense=True)
    assert result.accepted
    # Every PS applied the push exactly once: the kept one was not sent it twice.
    assert [s.params.version for s in cluster.servers] == [v + 1 for v in versions]
    for name, value in PARAMS.items():  # SGD: two pushes of ones at lr 0.1
        owner = cluster.servers[client.ps_of_param(name)]
        np.testing.assert_allclose(owner.params.dense[name], value - 0.2, rtol=1e-6)
        np.testing.assert_allclose(result.pulled.parameters[name], value - 0.2, rtol=1e-6)
    assert lost not in client.shared_memory_ps() and kept in client.shared_memory_ps()
    client.push_gradients(grads, learning_rate=0.1, pull_dense=True)  # attaches again
    assert client.shared_memory_ps() == holders
    assert len(cluster.servers[lost].servicer.regions) == 1
    client.close()


def test_sync_buffer_copies_gradients_out_of_the_region(ps_cluster):
    # grads_to_wait=2: the first push is buffered, the second applies the mean. Both come from
    # the same region, so a buffer that kept a view would average the second with itself.
    cluster = ps_cluster(1, use_async=False, grads_to_wait=2, sync_version_tolerance=1)
    client = _client(cluster, True)
    g1 = {n: np.full_like(v, 1.0) for n, v in PARAMS.items()}
    g2 = {n: np.full_like(v, 3.0) for n, v in PARAMS.items()}
    assert client.push_gradients(g1, learning_rate=0.1).accepted
    assert client.shared_memory_ps() == [0]
    assert client.push_gradients(g2, learning_rate=0.1).accepted
    for name, value in PARAMS.items():
        np.testing.assert_allclose(cluster.servers[0].params.dense[name], value - 0.2, rtol=1e-6)
    client.close()


def test_a_ps_whose_model_differs_refuses_the_region_and_messages_carry_on(ps_cluster, caplog):
    cluster = ps_cluster(1)
    client = _client(cluster, True)
    client.set_dense_layout({**PARAMS, "dense/bias": np.ones(11, np.float32)})  # wrong shape
    grads = {n: np.ones_like(v) for n, v in PARAMS.items()}
    with caplog.at_level("INFO"):
        result = client.push_gradients(grads, learning_rate=0.1, pull_dense=True)
    assert result.accepted and client.shared_memory_ps() == []
    assert "cannot share memory" in caplog.text and "dense/bias" in caplog.text
    np.testing.assert_allclose(result.pulled.parameters["dense/bias"], 0.9, rtol=1e-6)
    assert len(cluster.servers[0].servicer.regions) == 0
    client.close()


def test_switched_off_by_the_environment(ps_cluster, monkeypatch):
    monkeypatch.setenv(shm.ENV_SWITCH, "0")
    cluster = ps_cluster(1)
    client = PSClient(cluster.addrs)
    assert client.shared_memory is False
    client.close()


def test_pushes_go_through_the_local_channel_not_grpc(ps_cluster, monkeypatch):
    from elasticdl.ps.servicer import PserverServicer

    grpc_pushes = []
    original = PserverServicer.push_gradients_decoded

    def counting(self, push, context):
        grpc_pushes.append(push.request.shared_memory_region)
        return original(self, push, context)

    # Before the servers start (the gRPC handler of a push; the local channel's is answer_push).
    monkeypatch.setattr(PserverServicer, "push_gradients_decoded", counting)
    cluster = ps_cluster(2, opt_type="Adam", opt_args="learning_rate=0.01;")
    twin = ps_cluster(2, opt_type="Adam", opt_args="learning_rate=0.01;")
    fast, slow = _client(cluster, True), _client(twin, False)
    _train_both(fast, slow, steps=4, seed=1)
    holders = fast.shared_memory_ps()
    assert holders and all(fast._links[i].shared.channel is not None for i in holders)
    # Only the twin's message pushes (and the fast client's pushes to a PS holding no dense
    # parameter, if any) went through gRPC: none named a region.
    assert grpc_pushes and not any(grpc_pushes)
    fast.close()
    slow.close()


def test_a_broken_channel_falls_back_to_grpc_once_and_reconnects(ps_cluster):
    cluster = ps_cluster(1)
    client = _client(cluster, True)
    grads = {n: np.ones_like(v) for n, v in PARAMS.items()}
    client.push_gradients(grads, learning_rate=0.1, pull_dense=True)
    first = client._links[0].shared.channel.name
    cluster.servers[0].servicer._local_channel.close()  # the PS side of the channel goes away
    cluster.servers[0].servicer._local_channel = None
    result = client.push_gradients(grads, learning_rate=0.1, pull_dense=True)
    assert result.accepted and cluster.servers[0].params.version == 2  # applied exactly once
    for name, value in PARAMS.items():
        np.testing.assert_allclose(result.pulled.parameters[name], value - 0.2, rtol=1e-6)
    client.push_gradients(grads, learning_rate=0.1, pull_dense=True)  # attaches again
    channel = client._links[0].shared.channel
    assert channel is not None and channel.name != first
    assert cluster.servers[0].params.version == 3
    client.close()


def test_a_push_taken_on_the_channel_whose_answer_was_lost_is_not_taken_again(ps_cluster):
    import grpc
    from elasticdl.common import local_channel as lc

    cluster = ps_cluster(1)
    client = _client(cluster, True)
    grads = {n: np.ones_like(v) for n, v in PARAMS.items()}
    client.push_gradients(grads, learning_rate=0.1, pull_dense=True)
    channel = cluster.servers[0].servicer._local_channel
    assert client._links[0].shared.channel is not None and channel is not None
    real_answer, lost = channel._answer, []

    def answer_lost_once(kind, payload, region_id):
        answer = real_answer(kind, payload, region_id)  # the PS takes the push
        if kind == lc.PUSH and not lost:
            lost.append(kind)
            return lc.ERROR, lc.error_payload(grpc.StatusCode.UNAVAILABLE, "answer lost")
        return answer

    channel._answer = answer_lost_once
    result = client.push_gradients(grads, learning_rate=0.1, pull_dense=True)
    # The link sent the push again in a gRPC message; the PS answered it without taking it.
    assert lost and result.accepted and cluster.servers[0].params.version == 2
    for name, value in PARAMS.items():
        np.testing.assert_allclose(result.pulled.parameters[name], value - 0.2, rtol=1e-6)
    client.close()


def test_the_channel_admits_only_the_holder_of_the_region(ps_cluster):
    import grpc
    from elasticdl.common import local_channel as lc
    from elasticdl.proto import elasticdl_pb2 as pb

    cluster = ps_cluster(1)
    client = _client(cluster, True)
    client.push_gradients({n: np.ones_like(v) for n, v in PARAMS.items()}, learning_rate=0.1)
    link = client._links[0].shared
    name = link.channel.name
    with pytest.raises(lc.LocalChannelError) as bad_token:
        lc.LocalChannelClient(name, link.region_id, b"\0" * 16, timeout=5)
    assert bad_token.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(lc.LocalChannelError) as unknown:
        lc.LocalChannelClient(name, link.region_id ^ 1, link.region.token, timeout=5)
    assert unknown.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # A push on the channel must name the channel's region; PS errors keep their gRPC codes.
    other = pb.PushGradientsRequest(shared_memory_region=link.region_id ^ 1)
    with pytest.raises(lc.LocalChannelError) as wrong_region:
        link.channel.call(lc.PUSH, other.SerializeToString())
    assert wrong_region.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    bad = pb.PushGradientsRequest(shared_memory_region=link.region_id)
    bad.gradients.dense_parameters["nope"].dtype = pb.DT_FLOAT32
    with pytest.raises(lc.LocalChannelError) as not_found:
        link.channel.call(lc.PUSH, bad.SerializeToString())
    assert (
        not_found.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in not_found.value.details()
    )
    assert client.push_gradients({n: np.ones_like(v) for n, v in PARAMS.items()}).accepted
    client.close()


def test_a_refusing_ps_is_asked_again_less_and_less_often(ps_cluster, monkeypatch):
    from elasticdl.worker import ps_client

    cluster = ps_cluster(1)
    client = _client(cluster, True)
    client.set_dense_layout({**PARAMS, "dense/bias": np.ones(11, np.float32)})  # never fits
    attempts = []
    original = client._stubs[0].attach_shared_memory

    def counting(req, **kw):
        attempts.append(len(attempts))
        return original(req, **kw)

    monkeypatch.setattr(client._stubs[0], "attach_shared_memory", counting)
    grads = {n: np.ones_like(v) for n, v in PARAMS.items()}
    pushes = 1 + ps_client.ATTACH_RETRY_PUSHES + 2 * ps_client.ATTACH_RETRY_PUSHES + 5
    for _ in range(pushes):
        assert client.push_gradients(grads, learning_rate=0.001).accepted
    # Asked at push 1, after 100 more, after 200 more; not yet after 400 more.
    assert len(attempts) == 3 and client.shared_memory_ps() == []
    client.close()


def test_the_channel_bounds_what_it_reads_before_a_token(ps_cluster, monkeypatch):
    import socket
    import struct
    import subprocess
    import sys

    from elasticdl.common import local_channel as lc
    from elasticdl.ps import local_channel_server as lcs

    cluster = ps_cluster(1)
    client = _client(cluster, True)
    client.push_gradients({n: np.ones_like(v) for n, v in PARAMS.items()}, learning_rate=0.1)
    name = client._links[0].shared.channel.name

    def closed_by_ps(s) -> bool:
        try:
            return s.recv(1) == b""
        except ConnectionResetError:  # closed with bytes of ours unread
            return True

    def connect():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2)  # well below the PS's hello timeout
        s.connect(lc.abstract_address(name))
        return s

    # A first frame announcing 200 MiB is refused at once: the PS closes without reading it
    # (or waiting for it).
    s = connect()
    s.sendall(struct.pack("<I", 200 * 1024 * 1024) + bytes([lc.HELLO]))
    assert closed_by_ps(s)
    s.close()
    # A process of another user is refused before its HELLO is read (SO_PEERCRED); this
    # user's process with the same bytes gets an answer (a refusal of the unknown region).
    hello = struct.pack("<I", 9 + 16) + bytes([lc.HELLO]) + struct.pack("<Q", 1) + b"\0" * 16
    code = (
        "import os, socket, sys\n"
        "if len(sys.argv) > 2: os.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect('\\0' + sys.argv[1])\n"
        "try:\n"
        f"    s.sendall({hello!r}); answer = s.recv(1)\n"
        "except (BrokenPipeError, ConnectionResetError):\n"
        "    answer = b''\n"
        "sys.exit(0 if answer else 3)\n"
    )
    assert subprocess.run([sys.executable, "-c", code, name], timeout=30).returncode == 0
    if os.getuid() == 0:
        other = subprocess.run([sys.executable, "-c", code, name, "nobody"], timeout=30)
        assert other.returncode == 3
    # A peer that says nothing is dropped after the hello timeout.
    monkeypatch.setattr(lcs, "HELLO_TIMEOUT_S", 0.5)
    s = connect()
    assert closed_by_ps(s)
    s.close()
    # The channel still serves its worker.
    assert client.push_gradients({n: np.ones_like(v) for n, v in PARAMS.items()}).accepted
    client.close()


def test_a_hostile_worker_cannot_truncate_a_region_under_the_ps(ps_cluster):
    """What a worker (or any process of its user) could do to the memory the PS maps: the PS
    maps only sealed memfds, so truncating one fails, and anything else is refused at attach
    with the reason. The PS runs in this process: a SIGBUS would end the test."""
    import grpc
    from elasticdl.proto import elasticdl_pb2 as pb
    from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc

    cluster = ps_cluster(1)
    client = _client(cluster, True)
    grads = {n: np.ones_like(v) for n, v in PARAMS.items()}
    assert client.push_gradients(grads, learning_rate=0.1).accepted
    assert client.shared_memory_ps() == [0]
    # Every descriptor of the attached region in this process: none can change its size.
    fds = _region_fds()
    assert fds
    for fd in fds:
        for size in (0, 64):
            with pytest.raises(PermissionError):
                os.ftruncate(fd, size)
    version = cluster.servers[0].params.version
    assert client.push_gradients(grads, learning_rate=0.1, pull_dense=True).accepted
    assert cluster.servers[0].params.version == version + 1
    assert client.shared_memory_ps() == [0]

    # A hostile attach: an unsealed memfd, or a 0600 /dev/shm file of ours, with the right
    # size, token and slots. Refused with the reason; truncating them afterwards harms no one.
    stub = pb_grpc.PserverStub(grpc.insecure_channel(cluster.addrs[0]))
    good = shm.SharedRegion.create(
        {n: (v.dtype, v.shape) for n, v in PARAMS.items()}, tag="hostile"
    )
    unsealed = os.memfd_create(f"{shm.FILE_PREFIX}hostile", os.MFD_ALLOW_SEALING)
    path = os.path.join(shm.default_directory(), f"{shm.FILE_PREFIX}hostile-{os.getpid()}")
    in_dev_shm = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for fd, where, reason in (
            (unsealed, f"/proc/{os.getpid()}/fd/{unsealed}", "not sealed against truncation"),
            (in_dev_shm, path, "is not /proc/<pid>/fd/<fd>"),
            (in_dev_shm, f"/proc/{os.getpid()}/fd/{in_dev_shm}", "is not a region's memfd"),
        ):
            os.ftruncate(fd, good.size)
            os.pwrite(fd, good.token, 0)
            req = pb.AttachSharedMemoryRequest(
                worker_id=7, path=where, size=good.size, token=good.token
            )
            shm.slots_to_pb(good.slots.values(), req.slots)
            resp = stub.attach_shared_memory(req, timeout=10)
            assert not resp.attached and reason in resp.reason, resp.reason
            os.ftruncate(fd, 0)
    finally:
        os.close(unsealed)
        os.close(in_dev_shm)
        os.unlink(path)
        good.close()
    assert len(cluster.servers[0].servicer.regions) == 1  # only the honest worker's
    assert client.push_gradients(grads, learning_rate=0.1, pull_dense=True).accepted
    assert cluster.servers[0].params.version == version + 2
    client.close()


def _pull_client(cluster, shared: bool) -> PSClient:
    from elasticdl.worker.ps_client import EmbeddingTableInfo

    client = _client(cluster, shared)
    client.push_embedding_table_infos([EmbeddingTableInfo("emb", 4), EmbeddingTableInfo("w", 1)])
    # The first push attaches the region and connects the channel.
    client.push_gradients({n: np.ones_like(v) for n, v in PARAMS.items()}, learning_rate=0.1)
    return client


def _count_grpc_pulls(client: PSClient) -> list:
    """Every gRPC pull of rows the client makes from now on, as (ps_id, number of ids)."""
    calls = []
    for ps_id, stub in enumerate(client._stubs):
        method = stub.pull_embedding_vectors

        def counting(req, *args, _m=method, _ps=ps_id, **kwargs):
            calls.append((_ps, len(req.ids.content) // 8))
            return _m(req, *args, **kwargs)

        counting.future = lambda req, *a, _m=method, _ps=ps_id, **k: (
            calls.append((_ps, len(req.ids.content) // 8)) or _m.future(req, *a, **k)
        )
        stub.pull_embedding_vectors = counting
    return calls


@pytest.mark.parametrize("num_ps", [1, 3])
def test_embedding_pulls_go_through_the_local_channel_with_the_rows_of_grpc(ps_cluster, num_ps):
    cluster = ps_cluster(num_ps)
    fast, slow = _pull_client(cluster, True), _pull_client(cluster, False)
    assert fast.shared_memory_ps() and slow.shared_memory_ps() == []
    grpc_pulls = _count_grpc_pulls(fast)
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 10_000, 500)  # duplicates too: rows created on first use
    for name, dim in (("emb", 4), ("w", 1)):
        rows = fast.pull_embedding_vectors(name, ids, dim=dim)
        assert rows.shape == (ids.size, dim)
        np.testing.assert_array_equal(rows, slow.pull_embedding_vectors(name, ids, dim=dim))
        unique = np.unique(ids)
        np.testing.assert_array_equal(
            fast.pull_embedding_vectors(name, unique, dim=dim, ids_unique=True),
            slow.pull_embedding_vectors(name, unique, dim=dim, ids_unique=True),
        )
    # Only a PS this worker shares no region with (one that holds no dense parameter) got
    # its rows by gRPC.
    channel_ps = set(fast.shared_memory_ps())
    assert not any(ps_id in channel_ps for ps_id, _ in grpc_pulls)
    assert len(grpc_pulls) == 4 * (num_ps - len(channel_ps))
    # The channel still carries pushes afterwards: the pulls' answers were all read.
    result = fast.push_gradients(
        {n: np.ones_like(v) for n, v in PARAMS.items()},
        {"emb": (np.ones((2, 4), np.float32), np.array([1, 2]))},
        learning_rate=0.1,
        pull_dense=True,
    )
    assert result.accepted and set(fast.shared_memory_ps()) == channel_ps
    np.testing.assert_allclose(
        fast.pull_embedding_vectors("emb", [1, 2], dim=4),
        slow.pull_embedding_vectors("emb", [1, 2], dim=4),
    )
    fast.close()
    slow.close()


def test_a_ps_that_refuses_pulls_on_its_channel_gets_them_by_grpc(ps_cluster):
    from elasticdl.ps.errors import PSError

    cluster = ps_cluster(1)
    client = _pull_client(cluster, True)
    grpc_pulls = _count_grpc_pulls(client)

    def refuse(request):  # as a PS that predates pulls on the channel answers them
        raise PSError("frame kind 5 is not a push")

    cluster.servers[0].servicer._local_channel._handle_pull = refuse
    ids = np.arange(20)
    direct = cluster.servers[0].servicer.ps.pull_embedding_vectors("emb", ids)
    np.testing.assert_array_equal(client.pull_embedding_vectors("emb", ids, dim=4), direct)
    np.testing.assert_array_equal(client.pull_embedding_vectors("emb", ids, dim=4), direct)
    # Refused once on the channel, then by gRPC only; pushes keep the channel.
    assert grpc_pulls == [(0, 20), (0, 20)] and not client._links[0].pulls_on_channel
    # From then on no pull is offered to the channel (no request is built for it).
    assert not client._links[0].may_pull_on_channel()
    offered = []
    client._links[0].send_pulls = lambda requests: offered.append(requests) or False
    np.testing.assert_array_equal(client.pull_embedding_vectors("emb", ids, dim=4), direct)
    assert offered == []
    assert client.push_gradients(
        {n: np.ones_like(v) for n, v in PARAMS.items()}, learning_rate=0.1
    ).accepted
    assert client._links[0].shared.channel is not None
    client.close()


def test_a_pull_on_a_broken_channel_goes_by_grpc_and_the_next_push_reattaches(ps_cluster):
    cluster = ps_cluster(1)
    client = _pull_client(cluster, True)
    grpc_pulls = _count_grpc_pulls(client)
    first = client._links[0].shared.channel.name
    cluster.servers[0].servicer._local_channel.close()  # the PS side of the channel goes away
    cluster.servers[0].servicer._local_channel = None
    ids = np.arange(7, 17)
    direct = cluster.servers[0].servicer.ps.pull_embedding_vectors("emb", ids)
    np.testing.assert_array_equal(client.pull_embedding_vectors("emb", ids, dim=4), direct)
    assert grpc_pulls == [(0, 10)]
    version = cluster.servers[0].params.version
    assert client.push_gradients(
        {n: np.ones_like(v) for n, v in PARAMS.items()}, learning_rate=0.1
    ).accepted
    assert cluster.servers[0].params.version == version + 1  # applied exactly once
    client.push_gradients(
        {n: np.ones_like(v) for n, v in PARAMS.items()}, learning_rate=0.1
    )  # attaches again
    channel = client._links[0].shared.channel
    assert channel is not None and channel.name != first
    np.testing.assert_array_equal(client.pull_embedding_vectors("emb", ids, dim=4), direct)
    assert grpc_pulls == [(0, 10)]  # back on the channel
    client.close()


def test_a_pull_while_a_push_is_in_flight_takes_the_channel_on_its_own_connection(ps_cluster):
    # The trainer overlaps a push with the next step's pulls (async PS): they must not wait
    # for the push's answer nor fall back to gRPC.
    cluster = ps_cluster(1)
    client = _pull_client(cluster, True)
    grpc_pulls = _count_grpc_pulls(client)
    link = client._links[0]
    grads = {n: np.ones_like(v) for n, v in PARAMS.items()}
    link.prepare_push(client._push_parts(grads, None, 0.1, True)[0])
    link.send()
    try:
        ids = np.arange(10)
        direct = cluster.servers[0].servicer.ps.pull_embedding_vectors("emb", ids)
        np.testing.assert_array_equal(client.pull_embedding_vectors("emb", ids, dim=4), direct)
        assert link.receive().message.accepted
    finally:
        link.end_push()
    assert grpc_pulls == [] and link.shared.pull_channel is not None
    client.close()


@pytest.mark.parametrize("num_ids", [300, 20_000])
def test_several_tables_rows_come_in_one_round_trip_each_as_pulled_alone(ps_cluster, num_ids):
    # 20,000 ids: the requests after the first are too large to send before the first answer
    # is read, so they go one at a time on the same connection.
    from elasticdl.worker.ps_client import EmbeddingTableInfo

    cluster = ps_cluster(1)
    client = _pull_client(cluster, True)
    client.push_embedding_table_infos([EmbeddingTableInfo("emb2", 4)])
    grpc_pulls = _count_grpc_pulls(client)
    ids = np.random.default_rng(1).integers(0, 50_000, num_ids)
    tables = [("emb", 4), ("w", 1), ("emb2", 4)]
    together = client.pull_rows_of_tables(tables, ids)
    for (name, dim), rows in zip(tables, together):
        assert rows.shape == (ids.size, dim)
        np.testing.assert_array_equal(rows, client.pull_embedding_vectors(name, ids, dim=dim))
    assert grpc_pulls == []
    assert client.pull_rows_of_tables(tables, [])[1].shape == (0, 1)
    client.close()
