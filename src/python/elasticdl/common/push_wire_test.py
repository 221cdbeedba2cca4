"""push_wire: its bytes are the protobuf encoding of the same request (both ways), the PS reads
the rows as views, and whatever else a sender may write is read as protobuf reads it. The last
tests send pushes over real gRPC between the worker's client and a PS registered with and
without the hand-written handler."""
from concurrent import futures

import grpc
import numpy as np
import pytest
from elasticdl.common import tensor_utils as tu
from elasticdl.common.push_wire import DensePull, decode_push, encode_push, encode_push_answer
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc

RNG = np.random.default_rng(3)


def _rows(n, dim=4, start=0):
    return tu.IndexedRows(
        RNG.standard_normal((n, dim)).astype(np.float32), np.arange(start, start + n) * 7
    )


def _request(**fields):
    req = pb.PushGradientsRequest(
        gradients=pb.Model(version=5), learning_rate=0.25, worker_id=2, pull_dense_parameters=True
    )
    tu.ndarray_to_pb(np.ones(3, np.float32), req.gradients.dense_parameters["w"])
    for name, value in fields.items():
        setattr(req, name, value)
    return req


def _by_protobuf(req, embedding):
    """The same request built and serialized by protobuf alone."""
    full = pb.PushGradientsRequest()
    full.CopyFrom(req)
    for name, rows in embedding.items():
        tu.indexed_rows_to_pb(rows, full.gradients.embedding_tables[name])
    return full


def _assert_same_rows(got, want):
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name].values, want[name].values)
        np.testing.assert_array_equal(got[name].indices, want[name].indices)


TABLES = [
    {},
    {"emb": _rows(5)},
    {"a": _rows(3, dim=2), "b": _rows(0, dim=8), "": _rows(1, dim=1), "ü": _rows(2)},
]


@pytest.mark.parametrize("embedding", TABLES)
def test_protobuf_parses_the_hand_written_bytes_as_the_same_request(embedding):
    req = _request(shared_memory_region=9)
    parsed = pb.PushGradientsRequest.FromString(encode_push(req, embedding))
    assert parsed == _by_protobuf(req, embedding)
    assert req == _request(shared_memory_region=9)  # the caller's message is left as it was


@pytest.mark.parametrize("embedding", TABLES)
@pytest.mark.parametrize("writer", ["hand", "protobuf"])
def test_the_ps_reads_either_writers_bytes(embedding, writer):
    req = _request()
    data = (
        encode_push(req, embedding)
        if writer == "hand"
        else _by_protobuf(req, embedding).SerializeToString()
    )
    push = decode_push(data)
    assert push.embedding is not None  # the fast path read them
    assert not push.request.gradients.embedding_tables
    assert not push.request.gradients.dense_parameters
    bare = pb.PushGradientsRequest()
    bare.CopyFrom(req)
    bare.gradients.ClearField("dense_parameters")
    assert push.request == bare
    _assert_same_rows(push.embedding, embedding)
    assert list(push.dense) == ["w"] and push.dense["w"].tolist() == [1, 1, 1]


def test_state_a_push_carries_reaches_the_ps_beside_the_gradients_it_reads_itself():
    # Model.state (non-trainable variables) is not read by the fast path: protobuf parses it.
    req = _request()
    tu.ndarray_to_pb(np.full(2, 0.5, np.float32), req.gradients.state["bn/moving_mean"])
    push = decode_push(encode_push(req, {"emb": _rows(3)}, {"v": np.ones(2, np.float32)}))
    assert push.embedding is not None and set(push.dense) == {"w", "v"}  # the fast path ran
    assert list(push.request.gradients.state) == ["bn/moving_mean"]
    assert tu.pb_to_ndarray(push.request.gradients.state["bn/moving_mean"]).tolist() == [0.5] * 2


def test_the_rows_are_read_only_views_of_the_received_bytes():
    data = encode_push(_request(), {"emb": _rows(64)})
    rows = decode_push(data).embedding["emb"]
    raw = np.frombuffer(data, np.uint8)
    assert np.shares_memory(rows.values, raw) and np.shares_memory(rows.indices, raw)
    assert not rows.values.flags.writeable


def test_gradients_holding_only_tables_stay_present():
    req = pb.PushGradientsRequest(worker_id=1)
    push = decode_push(encode_push(req, {"emb": _rows(2)}))
    assert push.request.HasField("gradients") and push.request.worker_id == 1
    assert not decode_push(req.SerializeToString()).request.HasField("gradients")


def test_a_table_sent_twice_is_the_later_one_as_in_protobuf():
    first, second = {"emb": _rows(2)}, {"emb": _rows(3, start=10)}
    data = encode_push(_request(), first) + encode_push(pb.PushGradientsRequest(), second)
    _assert_same_rows(decode_push(data).embedding, second)
    protobuf = pb.PushGradientsRequest.FromString(data).gradients.embedding_tables["emb"]
    np.testing.assert_array_equal(tu.pb_to_indexed_rows(protobuf).indices, second["emb"].indices)


def _with_unknown_field_in_the_rows(data: bytes) -> bytes:
    """`data` with a field IndexedSlices does not define (number 15, a varint) added to its one
    table's rows, the way a newer sender could write it."""
    msg = pb.PushGradientsRequest.FromString(data)
    slices = msg.gradients.embedding_tables["emb"]
    extra = slices.SerializeToString() + bytes([15 << 3, 1])
    slices.Clear()
    slices.MergeFromString(extra)
    return msg.SerializeToString()


def test_what_the_fast_path_does_not_expect_is_parsed_by_protobuf():
    embedding = {"emb": _rows(4)}
    data = _with_unknown_field_in_the_rows(encode_push(_request(), embedding))
    push = decode_push(data)
    assert push.embedding is None  # protobuf read it: the rows stay in the message
    got = tu.pb_to_indexed_rows(push.request.gradients.embedding_tables["emb"])
    _assert_same_rows({"emb": got}, embedding)


def test_rows_that_do_not_match_their_ids_are_left_to_the_checks():
    bad = _request()
    tu.ndarray_to_pb(np.zeros((3, 4), np.float32), bad.gradients.embedding_tables["emb"].values)
    tu.ndarray_to_pb(np.arange(2), bad.gradients.embedding_tables["emb"].indices)
    push = decode_push(bad.SerializeToString())
    assert push.embedding is None  # as protobuf parses it; check_grad refuses it
    with pytest.raises(ValueError):
        encode_push(_request(), {"emb": tu.IndexedRows(np.zeros((3, 4)), np.arange(2))})


# ------------------------------------------------------------------ over real gRPC
def _ps(with_wire_handlers: bool):
    from elasticdl.ps.optimizer import Optimizer, parse_optimizer_config
    from elasticdl.ps.parameters import Parameters
    from elasticdl.ps.servicer import PserverServicer, wire_handlers
    from elasticdl.ps.updater import ParameterServer, UpdatePolicy

    params = Parameters(0, 1)
    optimizer = Optimizer(parse_optimizer_config("SGD", "learning_rate=1.0;"))
    servicer = PserverServicer(ParameterServer(params, optimizer, UpdatePolicy(use_async=True)))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    if with_wire_handlers:
        server.add_generic_rpc_handlers((wire_handlers(servicer),))
    pb_grpc.add_PserverServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, params, f"127.0.0.1:{port}"


@pytest.mark.parametrize("with_wire_handlers", [True, False])
def test_the_workers_push_is_applied_by_a_ps_with_or_without_the_handler(with_wire_handlers):
    from elasticdl.worker.ps_client import EmbeddingTableInfo, PSClient

    server, params, addr = _ps(with_wire_handlers)
    client = PSClient([addr], shared_memory=False)
    try:
        client.push_model({"w": np.zeros(2, np.float32)}, [EmbeddingTableInfo("emb", 3)])
        before = np.array(client.pull_embedding_vectors("emb", [4, 9, 1]))
        grads = np.array([[1, 2, 3], [4, 5, 6], [0.5, 0.5, 0.5], [1, 1, 1]], np.float32)
        ids = np.array([9, 4, 9, 1])  # 9 twice: summed by the client
        result = client.push_gradients({"w": np.ones(2, np.float32)}, {"emb": (grads, ids)})
        assert result.accepted and result.versions == {0: 1}
        after = client.pull_embedding_vectors("emb", [4, 9, 1])
        np.testing.assert_allclose(before - after, [[4, 5, 6], [1.5, 2.5, 3.5], [1, 1, 1]])
        np.testing.assert_allclose(params.dense["w"], [-1, -1])
    finally:
        client.close()
        server.stop(0)


def test_a_generated_stubs_push_is_applied_by_the_ps_with_the_handler():
    server, params, addr = _ps(with_wire_handlers=True)
    channel = grpc.insecure_channel(addr)
    stub = pb_grpc.PserverStub(channel)
    try:
        model = pb.Model()
        model.embedding_table_infos.add(name="emb", dim=2, initializer="zeros")
        stub.push_model(model)
        req = pb.PushGradientsRequest(gradients=pb.Model(version=0))
        tu.indexed_rows_to_pb(
            tu.IndexedRows(np.array([[1, 2], [3, 4]], np.float32), np.array([5, 6])),
            req.gradients.embedding_tables["emb"],
        )
        assert stub.push_gradients(req).accepted
        table = params.embedding_tables["emb"]
        np.testing.assert_allclose(table.get(np.array([5, 6])), [[-1, -2], [-3, -4]])
    finally:
        channel.close()
        server.stop(0)


def test_dense_gradients_written_by_hand_parse_as_protobufs_and_read_as_views():
    req = pb.PushGradientsRequest(gradients=pb.Model(version=2), worker_id=4)
    dense = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(1, np.float32)}
    data = encode_push(req, {"emb": _rows(3)}, dense)
    want = _by_protobuf(req, {"emb": _rows(0)})
    want.gradients.embedding_tables.clear()
    for name, grad in dense.items():
        tu.ndarray_to_pb(grad, want.gradients.dense_parameters[name])
    parsed = pb.PushGradientsRequest.FromString(data)
    parsed.gradients.embedding_tables.clear()
    assert parsed == want
    push = decode_push(data)
    assert sorted(push.dense) == ["b", "w"] and push.dense["w"].shape == (2, 3)
    np.testing.assert_array_equal(push.dense["w"], dense["w"])
    assert np.shares_memory(push.dense["w"], np.frombuffer(data, np.uint8))


@pytest.mark.parametrize(
    "params", [{}, {"w": np.arange(6, dtype=np.float32).reshape(3, 2), "": np.ones(0)}]
)
def test_the_ps_answer_with_pulled_parameters_parses_as_protobufs(params):
    answer = pb.PushGradientsResponse(accepted=True, version=7)
    pull = DensePull(answer.dense_parameters)
    pull.message.initialized, pull.message.version = True, 7
    pull.write(params)
    params_before = {n: np.array(v) for n, v in params.items()}
    for value in params.values():
        value += 1  # the answer holds a copy made by write()
    parsed = pb.PushGradientsResponse.FromString(encode_push_answer(answer, pull))
    want = pb.PushGradientsResponse(accepted=True, version=7)
    want.dense_parameters.initialized, want.dense_parameters.version = True, 7
    for name, value in params_before.items():
        tu.ndarray_to_pb(value, want.dense_parameters.dense_parameters[name])
    assert parsed == want
    no_pull = pb.PushGradientsResponse(accepted=True, version=7)
    assert encode_push_answer(no_pull, None) == no_pull.SerializeToString()
