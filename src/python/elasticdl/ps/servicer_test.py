"""The Pserver service over real gRPC on 127.0.0.1."""
import threading
from concurrent import futures

import grpc
import numpy as np
import pytest
from elasticdl.common import tensor_utils as tu
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc
from elasticdl.ps import checkpoint
from elasticdl.ps.server import PSConfig, PSServer
from elasticdl.ps.servicer import default_rows_per_message
from google.protobuf import empty_pb2


class RecordingMaster(pb_grpc.MasterServicer):
    """A real gRPC master that only records report_version calls."""

    def __init__(self):
        self.versions = []
        self.event = threading.Event()

    def report_version(self, request, context):
        self.versions.append((request.model_version, request.ps_id))
        self.event.set()
        return empty_pb2.Empty()


@pytest.fixture
def master():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = RecordingMaster()
    pb_grpc.add_MasterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


def start_ps(**kwargs):
    config = PSConfig(
        port=0, bind_host="127.0.0.1", opt_type="SGD", opt_args="learning_rate=0.1;", **kwargs
    )
    server = PSServer(config, secret=None)
    port = server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    return server, channel, pb_grpc.PserverStub(channel)


@pytest.fixture
def ps(tmp_path, master):
    servicer, addr = master
    server, channel, stub = start_ps(
        use_async=True,
        master_addr=addr,
        evaluation_steps=2,
        checkpoint_dir=str(tmp_path / "ckpt"),
        checkpoint_steps=3,
    )
    yield server, stub, servicer, tmp_path / "ckpt"
    channel.close()
    server.stop(0)


def model_pb(version=0):
    m = pb.Model(version=version)
    tu.ndarray_to_pb(np.arange(4, dtype=np.float32), m.dense_parameters["w"])
    m.embedding_table_infos.add(name="emb", dim=3, initializer="uniform")
    return m


def gradient(version, ids=(1, 2, 1)):
    req = pb.PushGradientsRequest(learning_rate=0.0)
    req.gradients.version = version
    tu.ndarray_to_pb(np.ones(4, np.float32), req.gradients.dense_parameters["w"])
    tu.indexed_rows_to_pb(
        tu.IndexedRows(np.ones((len(ids), 3), np.float32), np.array(ids)),
        req.gradients.embedding_tables["emb"],
    )
    return req


def test_full_rpc_flow(ps):
    server, stub, master, ckpt_dir = ps
    resp = stub.pull_dense_parameters(pb.PullDenseParametersRequest(version=-1))
    assert not resp.initialized and not resp.dense_parameters

    stub.push_model(model_pb())
    stub.push_model(model_pb(version=7))  # ignored: first push wins
    resp = stub.pull_dense_parameters(pb.PullDenseParametersRequest(version=-1))
    assert resp.initialized and resp.version == 0
    np.testing.assert_array_equal(tu.pb_to_ndarray(resp.dense_parameters["w"]), np.arange(4))
    resp = stub.pull_dense_parameters(pb.PullDenseParametersRequest(version=0))
    assert resp.initialized and not resp.dense_parameters  # nothing newer than 0

    vec = tu.pb_to_ndarray(
        stub.pull_embedding_vectors(
            pb.PullEmbeddingVectorsRequest(name="emb", ids=tu.ndarray_to_pb(np.array([2, 1, 2])))
        )
    )
    assert vec.shape == (3, 3) and np.abs(vec).max() <= 0.05
    np.testing.assert_array_equal(vec[0], vec[2])

    for v in range(3):
        r = stub.push_gradients(gradient(v))
        assert r.accepted and r.version == v + 1
    resp = stub.pull_dense_parameters(pb.PullDenseParametersRequest(version=2))
    assert resp.version == 3
    np.testing.assert_allclose(
        tu.pb_to_ndarray(resp.dense_parameters["w"]), np.arange(4) - 0.3, rtol=1e-6
    )
    after = tu.pb_to_ndarray(
        stub.pull_embedding_vectors(
            pb.PullEmbeddingVectorsRequest(name="emb", ids=tu.ndarray_to_pb(np.array([1, 2])))
        )
    )
    np.testing.assert_allclose(after, vec[[1, 0]] - np.array([[0.6], [0.3]]), rtol=1e-5)

    # version 2 reported to the master, version 3 checkpointed in the background
    assert master.event.wait(5)
    assert master.versions[0] == (2, 0)
    server.checkpointer.flush()
    assert checkpoint.get_latest_valid_version_dir(str(ckpt_dir)).endswith("version-3")

    saved = stub.save_checkpoint(pb.SaveCheckpointRequest())
    assert saved.version == 3 and saved.path.endswith("version-3/variables-0-of-1.ckpt")


def test_stream_table_in_chunks(ps):
    _, stub, _, _ = ps
    stub.push_model(model_pb())
    ids = np.arange(0, 1000, 3)
    stub.pull_embedding_vectors(
        pb.PullEmbeddingVectorsRequest(name="emb", ids=tu.ndarray_to_pb(ids[::-1].copy()))
    )
    chunks = [
        tu.pb_to_indexed_rows(m)
        for m in stub.pull_embedding_table(
            pb.PullEmbeddingTableRequest(name="emb", max_rows_per_message=100)
        )
    ]
    assert [c.indices.size for c in chunks] == [100, 100, 100, 34]
    got = np.concatenate([c.indices for c in chunks])
    np.testing.assert_array_equal(got, ids)  # every row once, sorted by id
    one = [
        tu.pb_to_indexed_rows(m)
        for m in stub.pull_embedding_table(pb.PullEmbeddingTableRequest(name="emb"))
    ]
    assert len(one) == 1 and default_rows_per_message(3) > 334
    np.testing.assert_array_equal(one[0].values, np.concatenate([c.values for c in chunks]))


def test_errors_map_to_status_codes(ps):
    _, stub, _, _ = ps
    stub.push_model(model_pb())
    with pytest.raises(grpc.RpcError) as e:
        stub.pull_embedding_vectors(
            pb.PullEmbeddingVectorsRequest(name="missing", ids=tu.ndarray_to_pb(np.array([1])))
        )
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and "missing" in e.value.details()
    bad = gradient(0)
    tu.ndarray_to_pb(np.ones(5, np.float32), bad.gradients.dense_parameters["w"])
    with pytest.raises(grpc.RpcError) as e:
        stub.push_gradients(bad)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "shape" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        list(stub.pull_embedding_table(pb.PullEmbeddingTableRequest(name="nope")))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_sync_ps_over_grpc_averages_and_rejects_stale(tmp_path):
    server, channel, stub = start_ps(grads_to_wait=2)
    try:
        stub.push_model(model_pb())
        assert stub.push_gradients(gradient(0)).version == 0
        assert stub.push_gradients(gradient(0)).version == 1
        r = stub.push_gradients(gradient(0))  # stale: PS is at 1, tolerance 0
        assert not r.accepted and r.version == 1
        w = tu.pb_to_ndarray(
            stub.pull_dense_parameters(pb.PullDenseParametersRequest(version=-1)).dense_parameters[
                "w"
            ]
        )
        np.testing.assert_allclose(w, np.arange(4) - 0.1, rtol=1e-6)
    finally:
        channel.close()
        server.stop(0)


def test_concurrent_async_pushes_are_all_applied():
    server, channel, stub = start_ps(use_async=True)
    try:
        stub.push_model(model_pb())
        with futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda _: stub.push_gradients(gradient(0)), range(40)))
        assert all(r.accepted for r in results)
        assert sorted(r.version for r in results) == list(range(1, 41))
        w = tu.pb_to_ndarray(
            stub.pull_dense_parameters(pb.PullDenseParametersRequest(version=-1)).dense_parameters[
                "w"
            ]
        )
        np.testing.assert_allclose(w, np.arange(4) - 4.0, rtol=1e-5)
    finally:
        channel.close()
        server.stop(0)


def _w(resp):
    return tu.pb_to_ndarray(resp.dense_parameters["w"])


def test_push_with_pull_dense_parameters_answers_with_the_updated_model():
    # Sync, two gradients per version: the answer is what pull_dense_parameters(version of the
    # gradients) returns right after the push, present even when nothing is newer.
    server, channel, stub = start_ps(grads_to_wait=2)
    try:
        stub.push_model(model_pb())
        req = gradient(0)
        req.pull_dense_parameters = True
        first = stub.push_gradients(req)
        assert first.accepted and first.version == 0
        assert first.HasField("dense_parameters")
        assert first.dense_parameters.initialized and first.dense_parameters.version == 0
        assert not first.dense_parameters.dense_parameters  # buffered: nothing newer yet
        second = stub.push_gradients(req)  # the second gradient applies: version 1
        assert second.accepted and second.dense_parameters.version == 1
        np.testing.assert_allclose(_w(second.dense_parameters), np.arange(4) - 0.1, rtol=1e-6)
        # A stale push is rejected, and the answer carries the model to recompute against.
        stale = stub.push_gradients(req)
        assert not stale.accepted and stale.dense_parameters.version == 1
        np.testing.assert_allclose(_w(stale.dense_parameters), np.arange(4) - 0.1, rtol=1e-6)
        # Without the flag nothing comes back (and nothing extra is serialised).
        plain = gradient(1)
        assert not stub.push_gradients(plain).HasField("dense_parameters")
    finally:
        channel.close()
        server.stop(0)


def test_push_with_pull_on_an_uninitialised_ps_says_so():
    server, channel, stub = start_ps(use_async=True)
    try:
        req = gradient(0)
        req.pull_dense_parameters = True
        resp = stub.push_gradients(req)
        assert not resp.accepted
        assert resp.HasField("dense_parameters") and not resp.dense_parameters.initialized
    finally:
        channel.close()
        server.stop(0)


def test_save_checkpoint_only_inside_the_jobs_checkpoint_dir(ps, tmp_path):
    _, stub, _, ckpt_dir = ps
    stub.push_model(model_pb())
    outside = tmp_path / "elsewhere"
    for bad in (str(outside), str(ckpt_dir / ".." / "elsewhere"), "../elsewhere"):
        with pytest.raises(grpc.RpcError) as e:
            stub.save_checkpoint(pb.SaveCheckpointRequest(checkpoint_dir=bad))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "outside the job's checkpoint directory" in e.value.details()
    assert not outside.exists()
    inside = stub.save_checkpoint(pb.SaveCheckpointRequest(checkpoint_dir=str(ckpt_dir / "sub")))
    assert inside.path.startswith(str(ckpt_dir / "sub" / "version-"))
    relative = stub.save_checkpoint(pb.SaveCheckpointRequest(checkpoint_dir="rel"))
    assert relative.path.startswith(str(ckpt_dir / "rel" / "version-"))


def test_checkpoint_dir_within_needs_a_job_dir(tmp_path):
    from elasticdl.ps.errors import PSError
    from elasticdl.ps.servicer import checkpoint_dir_within

    assert checkpoint_dir_within("", "") is None
    with pytest.raises(PSError, match="no --checkpoint_dir"):
        checkpoint_dir_within(str(tmp_path), "")
    link = tmp_path / "ckpt" / "escape"
    (tmp_path / "ckpt").mkdir()
    link.symlink_to(tmp_path / "other")
    with pytest.raises(PSError, match="outside"):
        checkpoint_dir_within(str(link), str(tmp_path / "ckpt"))


def test_the_ps_reads_pushes_with_the_codec_elasticdl_ops_loaded():
    from elasticdl.common import push_wire
    from elasticdl.ops import _backend

    assert push_wire._native is _backend.native
