import numpy as np
import pytest
from elasticdl.common.hash_utils import string_to_id
from elasticdl.common.tensor_utils import aligned_empty
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.worker.ps_client import (
    EmbeddingTableInfo,
    PSClient,
    PSUnavailableError,
    deduplicate_indexed_rows,
)


def test_deduplicate_sums_rows_of_equal_ids():
    values = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]], np.float32)
    summed, ids = deduplicate_indexed_rows(values, np.array([3, 1, 3]))
    assert ids.tolist() == [1, 3]
    np.testing.assert_allclose(summed, [[2, 2], [4, 4]])


def test_dense_params_are_placed_by_name_hash(ps_cluster):
    cluster = ps_cluster(3)
    client = PSClient(cluster.addrs)
    params = {f"layer{i}/kernel": np.full((2, 2), i, np.float32) for i in range(8)}
    client.push_model(params)
    for name, value in params.items():
        owner = string_to_id(name, 3)
        held = cluster.servers[owner].params.dense
        assert name in held
        np.testing.assert_array_equal(np.asarray(held[name]).reshape(2, 2), value)
        for other in set(range(3)) - {owner}:
            assert name not in cluster.servers[other].params.dense
    pulled = client.pull_dense_parameters()
    assert pulled.all_initialized and sorted(pulled.parameters) == sorted(params)
    # Nothing newer on the PS: a second pull returns nothing.
    assert client.pull_dense_parameters().parameters == {}
    assert client.pull_dense_parameters(force=True).parameters.keys() == params.keys()
    client.close()


def test_embedding_rows_routed_by_id_mod_and_chunked(ps_cluster):
    cluster = ps_cluster(2)
    # 16 bytes per row and a 48-byte budget: 3 rows per message, so many messages per PS.
    client = PSClient(cluster.addrs, max_message_bytes=48)
    client.push_model({"w": np.zeros(2, np.float32)}, [EmbeddingTableInfo("emb", 4, "uniform")])
    assert client.rows_per_message("emb") == 3
    ids = np.array([7, 2, 7, 10, 3, 2, 5, 8, 1], np.int64)
    rows = client.pull_embedding_vectors("emb", ids)
    assert rows.shape == (9, 4)
    np.testing.assert_array_equal(rows[0], rows[2])  # duplicate ids -> same row
    # Rows were created on their owners only.
    for s, server in enumerate(cluster.servers):
        held = set(np.asarray(server.params.embedding_tables["emb"].ids).tolist())
        assert held == {i for i in ids.tolist() if i % 2 == s}
    # The same ids again return the same (stored) values.
    np.testing.assert_array_equal(client.pull_embedding_vectors("emb", ids[::-1]), rows[::-1])
    client.close()


def test_push_gradients_applies_sgd_on_owning_ps(ps_cluster):
    cluster = ps_cluster(2)
    client = PSClient(cluster.addrs)
    client.push_model(
        {"a": np.ones(3, np.float32), "b": np.ones(2, np.float32)},
        [EmbeddingTableInfo("emb", 2, "zeros")],
    )
    client.pull_dense_parameters()
    client.pull_embedding_vectors("emb", [1, 2, 3])
    result = client.push_gradients(
        {"a": np.ones(3, np.float32), "b": np.full(2, 2.0, np.float32)},
        {"emb": (np.ones((3, 2), np.float32), np.array([3, 1, 3]))},
        learning_rate=0.5,
    )
    assert result.accepted
    pulled = client.pull_dense_parameters().parameters
    np.testing.assert_allclose(pulled["a"], [0.5, 0.5, 0.5])
    np.testing.assert_allclose(pulled["b"], [0.0, 0.0])
    rows = client.pull_embedding_vectors("emb", [1, 2, 3])
    np.testing.assert_allclose(rows, [[-0.5, -0.5], [0, 0], [-1.0, -1.0]])  # 3 appeared twice
    assert all(v >= 1 for v in client.ps_versions)
    client.close()


def test_unreachable_ps_gives_up_after_retry_budget():
    client = PSClient(["127.0.0.1:1"], retry_timeout=0.5, rpc_timeout=0.5)
    with pytest.raises(PSUnavailableError, match="unreachable"):
        client.pull_dense_parameters()
    client.close()


def test_pull_after_the_ps_went_back_to_an_older_version_gets_everything(ps_cluster):
    cluster = ps_cluster(1)
    client = PSClient(cluster.addrs)
    client.push_model({"w": np.zeros(3, np.float32)})
    for _ in range(3):
        client.pull_dense_parameters()
        client.push_gradients({"w": np.ones(3, np.float32)}, learning_rate=0.1)
    client.pull_dense_parameters()
    assert client.ps_versions == [3]
    # The PS is restored from a checkpoint of version 1 (as a relaunched PS would be).
    ps = cluster.servers[0].ps
    snapshot = ps.snapshot()
    snapshot.version = 1
    snapshot.dense_parameters["w"].content = np.full(3, 7.0, np.float32).tobytes()
    ps.restore(snapshot)
    result = client.pull_dense_parameters()
    np.testing.assert_allclose(result.parameters["w"], [7.0, 7.0, 7.0])
    assert client.ps_versions == [1]


def test_push_with_pull_dense_returns_what_a_pull_would(ps_cluster):
    cluster = ps_cluster(2)
    client = PSClient(cluster.addrs)
    client.push_model({"a": np.ones(3, np.float32), "b": np.ones(2, np.float32)})
    client.pull_dense_parameters()
    result = client.push_gradients(
        {"a": np.ones(3, np.float32), "b": np.full(2, 2.0, np.float32)},
        learning_rate=0.5,
        pull_dense=True,
    )
    assert result.accepted and result.pulled is not None and result.pulled.all_initialized
    np.testing.assert_allclose(result.pulled.parameters["a"], [0.5, 0.5, 0.5])
    np.testing.assert_allclose(result.pulled.parameters["b"], [0.0, 0.0])
    assert client.ps_versions == [1, 1]
    # The local copy is current: a pull now brings nothing new.
    assert client.pull_dense_parameters().parameters == {}
    client.close()


def test_push_with_pull_dense_against_a_ps_that_predates_it(ps_cluster, monkeypatch):
    from elasticdl.ps.servicer import PserverServicer

    def old_ps_push(self, push, context):  # an older PS: the field is unknown
        resp = self.handle_push(push.request, push.embedding, push.dense)
        resp.ClearField("dense_parameters")
        return resp.SerializeToString()

    # Before the server starts: gRPC binds the handlers when the servicer is registered.
    monkeypatch.setattr(PserverServicer, "push_gradients_decoded", old_ps_push)
    cluster = ps_cluster(1)
    client = PSClient(cluster.addrs, stream_channel=False)  # the gRPC push's answer
    client.push_model({"w": np.zeros(3, np.float32)})
    client.pull_dense_parameters()
    result = client.push_gradients(
        {"w": np.ones(3, np.float32)}, learning_rate=0.1, pull_dense=True
    )
    assert result.accepted and result.pulled is None
    assert client.ps_versions == [0]  # not advanced: the caller must pull
    np.testing.assert_allclose(client.pull_dense_parameters().parameters["w"], [-0.1] * 3)
    client.close()


def test_a_push_whose_answer_was_lost_is_sent_again_and_taken_once(ps_cluster, monkeypatch):
    import grpc
    from elasticdl.ps import server as ps_server

    real_handlers = ps_server.wire_handlers
    lost = []

    class AnswerLostOnce(grpc.GenericRpcHandler):
        """The PS takes the first push, then its answer is lost (the call ends UNAVAILABLE, as
        when the connection breaks after the request arrived)."""

        def __init__(self, servicer):
            self.real = real_handlers(servicer)

        def service(self, details):
            handler = self.real.service(details)
            if handler is None or not details.method.endswith("/push_gradients"):
                return handler

            def push(request, context):
                answer = handler.unary_unary(request, context)
                if not lost:
                    lost.append(request.request.push_id)
                    context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset by the test")
                return answer

            return grpc.unary_unary_rpc_method_handler(
                push,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )

    monkeypatch.setattr(ps_server, "wire_handlers", AnswerLostOnce)
    cluster = ps_cluster(1)
    client = PSClient(cluster.addrs, retry_timeout=10, shared_memory=False, stream_channel=False)
    client.push_model({"a": np.ones(3, np.float32)}, [EmbeddingTableInfo("emb", 2, "zeros")])
    client.pull_dense_parameters()
    result = client.push_gradients(
        {"a": np.ones(3, np.float32)},
        {"emb": (np.ones((2, 2), np.float32), np.array([1, 2]))},
        learning_rate=0.5,
        pull_dense=True,
    )
    assert lost and lost[0] != 0  # the answer was lost once and the push had a number
    assert result.accepted and client.ps_versions == [1]
    ps = cluster.servers[0].ps
    assert ps.version == 1  # taken once, though it arrived twice
    np.testing.assert_allclose(ps.params.dense["a"], [0.5, 0.5, 0.5])
    np.testing.assert_allclose(result.pulled.parameters["a"], [0.5, 0.5, 0.5])
    np.testing.assert_allclose(client.pull_embedding_vectors("emb", [1, 2]), -0.5)
    # The next push is a new one.
    assert client.push_gradients({"a": np.ones(3, np.float32)}, learning_rate=0.5).accepted
    assert ps.version == 2
    client.close()


def test_a_block_of_parameters_is_taken_as_it_came_when_aligned_and_refused_when_unknown():
    client = PSClient(["127.0.0.1:1"])
    client.set_dense_layout({"b": np.zeros(2, np.float32), "w": np.zeros((2, 3), np.float32)})
    block = aligned_empty(8, np.float32)
    block[:] = np.arange(8)
    resp = pb.PullDenseParametersResponse(
        initialized=True, version=1, packed_names=["b", "w"], packed_dtype=pb.DT_FLOAT32
    )
    got = client._packed_block(0, resp, memoryview(block.view(np.uint8)))
    assert np.shares_memory(got, block)  # used where it was received
    np.testing.assert_array_equal(got, block)
    raw = np.empty(block.nbytes + 128, np.uint8)
    start = -raw.ctypes.data % 64 + 4  # 4 bytes past a 64-byte boundary, as gRPC's bytes may be
    odd = raw[start : start + block.nbytes]
    odd[:] = block.view(np.uint8)
    copied = client._packed_block(0, resp, memoryview(odd))
    assert copied.ctypes.data % 64 == 0 and not np.shares_memory(copied, odd)
    np.testing.assert_array_equal(copied, block)
    for names, dtype, data in (
        (["w", "b"], pb.DT_FLOAT32, block),  # another order
        (["b"], pb.DT_FLOAT32, block[:2]),  # a tensor short
        (["b", "w"], pb.DT_FLOAT64, block.astype(np.float64)),  # another dtype
        (["b", "w"], pb.DT_FLOAT32, block[:7]),  # another size
    ):
        resp.ClearField("packed_names")
        resp.packed_names.extend(names)
        resp.packed_dtype = dtype
        with pytest.raises(RuntimeError, match="different models"):
            client._packed_block(0, resp, memoryview(np.ascontiguousarray(data).view(np.uint8)))
    client.close()
