"""push_wire: its bytes are the protobuf encoding of the same request (both ways), the PS reads
the rows as views, and whatever else a sender may write is read as protobuf reads it. The last
tests send pushes over real gRPC between the worker's client and a PS registered with and
without the hand-written handler."""
from concurrent import futures

import grpc
import numpy as np
import pytest
from elasticdl.common import tensor_utils as tu
from elasticdl.common.push_wire import (
    DensePull,
    decode_push,
    decode_push_answer,
    encode_push,
    push_answer_pieces,
)
from elasticdl.ops import _backend
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc
from google.protobuf.message import DecodeError

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
    data = b"".join(push_answer_pieces(answer, pull))
    parsed = pb.PushGradientsResponse.FromString(data)
    want = pb.PushGradientsResponse(accepted=True, version=7)
    want.dense_parameters.initialized, want.dense_parameters.version = True, 7
    for name, value in params_before.items():
        tu.ndarray_to_pb(value, want.dense_parameters.dense_parameters[name])
    assert parsed == want
    no_pull = pb.PushGradientsResponse(accepted=True, version=7)
    assert push_answer_pieces(no_pull, None) == [no_pull.SerializeToString()]
    # The worker reads the parameters as views of the bytes, the rest as the message.
    read = decode_push_answer(data)
    assert read.message == pb.PushGradientsResponse(
        accepted=True,
        version=7,
        dense_parameters=pb.PullDenseParametersResponse(initialized=True, version=7),
    )
    assert read.pulled.keys() == params_before.keys()
    for name, value in params_before.items():
        np.testing.assert_array_equal(read.pulled[name], value)
        assert read.pulled[name].dtype == value.dtype and read.pulled[name].shape == value.shape
        if value.size:
            assert np.shares_memory(read.pulled[name], np.frombuffer(data, np.uint8))
            assert not read.pulled[name].flags.writeable


def _answer_by_protobuf(params, **pull_fields) -> pb.PushGradientsResponse:
    answer = pb.PushGradientsResponse(accepted=True, version=3)
    answer.dense_parameters.SetInParent()
    for field_name, value in pull_fields.items():
        setattr(answer.dense_parameters, field_name, value)
    for name, value in params.items():
        tu.ndarray_to_pb(value, answer.dense_parameters.dense_parameters[name])
    return answer


def _read_as_protobuf(read) -> pb.PushGradientsResponse:
    """The message `decode_push_answer` read, with the parameters it read apart put back."""
    whole = pb.PushGradientsResponse()
    whole.CopyFrom(read.message)
    for name, value in (read.pulled or {}).items():
        tu.ndarray_to_pb(np.array(value), whole.dense_parameters.dense_parameters[name])
    if read.packed is not None:
        whole.dense_parameters.packed_values = bytes(read.packed)
    return whole


def _digest(params) -> bytes:
    return push_wire.packed_layout_digest({n: (a.dtype, a.shape) for n, a in params.items()})


def _packed_answer(params, version=3) -> bytes:
    answer = pb.PushGradientsResponse(accepted=True, version=version)
    pull = DensePull(answer.dense_parameters, packed=_digest(params))
    pull.message.initialized, pull.message.version = True, version
    pull.write(params)
    return b"".join(bytes(memoryview(p).cast("B")) for p in push_answer_pieces(answer, pull))


def _aligned_copy(data: bytes) -> np.ndarray:
    """`data` in a buffer that starts at a 64-byte boundary, as a channel reads an answer."""
    buf = tu.aligned_empty(len(data), np.uint8)
    buf[:] = np.frombuffer(data, np.uint8)
    return buf


PACKED_PARAMS = {
    "w": np.arange(12, dtype=np.float32).reshape(3, 4),
    "b": np.array([5.0, 6.0], dtype=np.float32),
    "empty": np.zeros((0, 3), dtype=np.float32),
}


def test_a_packed_answer_parses_as_protobufs_its_block_in_name_order():
    data = _packed_answer(PACKED_PARAMS, version=7)
    parsed = pb.PushGradientsResponse.FromString(data)
    pulled = parsed.dense_parameters
    assert parsed.accepted and parsed.version == 7 and pulled.initialized and pulled.version == 7
    assert list(pulled.packed_names) == ["b", "empty", "w"] and not pulled.dense_parameters
    assert pulled.packed_dtype == pb.DT_FLOAT32
    want = np.concatenate([PACKED_PARAMS[n].reshape(-1) for n in ("b", "empty", "w")])
    assert pulled.packed_values == want.tobytes()
    assert set(pulled.packed_padding) <= {0}
    # The worker reads the block as a view of the answer, the rest as protobuf does.
    buf = _aligned_copy(data)
    read = decode_push_answer(buf)
    assert read.pulled == {} and read.packed is not None
    assert np.shares_memory(np.frombuffer(read.packed, np.uint8), buf)
    assert bytes(read.packed) == want.tobytes()
    assert not read.message.dense_parameters.packed_values  # read apart, not parsed twice
    assert _read_as_protobuf(read) == parsed


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.float64])
def test_a_packed_block_starts_at_a_64_byte_offset_whatever_precedes_it(dtype):
    # The answer's head grows with the names and the version, and the field's length prefix
    # with the block (one more byte past 127 bytes, and past 16,383): every remainder of 64.
    seen = set()
    for name_length in range(1, 70):
        for count in (1, 3, 14, 16, 31, 32, 2040, 2050, 4100):
            for version in (1, 300):
                params = {"p" * name_length: np.ones(count, dtype)}
                data = _packed_answer(params, version)
                read = decode_push_answer(_aligned_copy(data))
                block = np.frombuffer(read.packed, dtype)
                assert block.ctypes.data % 64 == 0, (name_length, count, version)
                assert block.size == count and (block == 1).all()
                padding = pb.PushGradientsResponse.FromString(data).dense_parameters.packed_padding
                seen.add(len(padding) % 64)
    assert len(seen) == 64  # every offset the head left was padded to the boundary


def test_parameters_travel_as_a_block_only_when_the_ps_holds_them_as_the_worker_lays_them_out():
    fewer = {n: v for n, v in PACKED_PARAMS.items() if n != "b"}
    wider = {**PACKED_PARAMS, "b": np.zeros(3, np.float32)}
    doubles = {n: v.astype(np.float64) for n, v in PACKED_PARAMS.items()}
    for held, asked in (
        (PACKED_PARAMS, b""),  # not asked
        (PACKED_PARAMS, _digest(fewer)),  # the worker's model lacks a tensor
        (PACKED_PARAMS, _digest(wider)),  # or has one of another shape
        (PACKED_PARAMS, _digest(doubles)),  # or of another dtype
        (ANSWER_PARAMS, _digest(ANSWER_PARAMS)),  # several dtypes: no one block
        ({}, _digest({})),
    ):
        answer = pb.PushGradientsResponse(accepted=True, version=3)
        pull = DensePull(answer.dense_parameters, packed=asked)
        pull.write(held)
        assert pull.values is None and not pull.message.packed_names
        read = decode_push_answer(b"".join(push_answer_pieces(answer, pull)))
        assert read.packed is None and read.pulled.keys() == held.keys()


ANSWER_PARAMS = {
    "dense/kernel": np.arange(12, dtype=np.float32).reshape(3, 4),
    "steps": np.array([5, 6], dtype=np.int64),
    "half": np.ones((2, 2), dtype=np.float16),
    "empty": np.zeros((0, 3), dtype=np.float32),
}


def test_an_answer_protobuf_wrote_reads_as_protobuf_reads_it_the_parameters_as_views():
    answer = _answer_by_protobuf(ANSWER_PARAMS, initialized=True, version=3)
    tu.ndarray_to_pb(np.ones(2, np.float32), answer.dense_parameters.state["bn/mean"])
    data = bytearray(answer.SerializeToString())  # as a channel frame arrives
    read = decode_push_answer(data)
    assert read.pulled is not None and read.pulled.keys() == ANSWER_PARAMS.keys()
    assert not read.message.dense_parameters.dense_parameters  # read apart, not parsed twice
    assert read.message.dense_parameters.state.keys() == {"bn/mean"}  # the rest as protobuf's
    assert _read_as_protobuf(read) == answer
    assert np.shares_memory(read.pulled["dense/kernel"], np.frombuffer(data, np.uint8))


def test_an_answer_without_a_pull_or_with_an_empty_one_is_protobufs():
    bare = pb.PushGradientsResponse(accepted=False, version=9)
    read = decode_push_answer(bare.SerializeToString())
    assert read.message == bare and not read.message.HasField("dense_parameters")
    assert read.pulled == {}
    empty = _answer_by_protobuf({})
    read = decode_push_answer(empty.SerializeToString())
    assert read.message == empty and read.message.HasField("dense_parameters")


def test_a_parameter_sent_twice_is_the_later_one_and_occurrences_merge_as_in_protobuf():
    first = _answer_by_protobuf({"w": np.zeros(2, np.float32)}, initialized=True)
    second = _answer_by_protobuf({"w": np.ones(2, np.float32)}, version=4)
    data = first.SerializeToString() + second.SerializeToString()
    read = decode_push_answer(data)
    assert read.pulled is not None
    assert _read_as_protobuf(read) == pb.PushGradientsResponse.FromString(data)
    np.testing.assert_array_equal(read.pulled["w"], np.ones(2, np.float32))


def test_what_the_answer_reader_does_not_expect_is_parsed_by_protobuf():
    answer = _answer_by_protobuf({"w": np.ones(2, np.float32)}, initialized=True)
    data = answer.SerializeToString()
    # A map entry with a third field: legal protobuf (unknown), not the usual layout.
    entry = tu._varint(1 << 3 | 2) + b"\x01w" + tu._varint(3 << 3 | 0) + b"\x07"
    odd = (
        data
        + tu._varint(3 << 3 | 2)
        + tu._varint(len(entry) + 2)
        + (tu._varint(3 << 3 | 2) + tu._varint(len(entry)) + entry)
    )
    read = decode_push_answer(odd)
    assert read.pulled is None
    assert read.message == pb.PushGradientsResponse.FromString(odd)
    with pytest.raises(DecodeError):  # not an answer at all: protobuf's own error
        decode_push_answer(b"\xff\xff")


@pytest.mark.parametrize("packed", [False, True], ids=["tensors", "block"])
def test_truncated_and_corrupted_answers_read_as_protobuf_reads_them(packed):
    if packed:
        data = _packed_answer(PACKED_PARAMS)
    else:
        data = _answer_by_protobuf(ANSWER_PARAMS, initialized=True, version=3).SerializeToString()
    rng = np.random.default_rng(11)
    cases = [data[:n] for n in range(0, len(data), 7)]
    for _ in range(300):
        corrupted = bytearray(data)
        for pos in rng.integers(0, len(data), 3):
            corrupted[pos] = int(rng.integers(0, 256))
        cases.append(bytes(corrupted))
    for case in cases:
        try:
            want = pb.PushGradientsResponse.FromString(case)
        except DecodeError:
            with pytest.raises(DecodeError):
                decode_push_answer(case)
            continue
        assert _read_as_protobuf(decode_push_answer(case)) == want


# ------------------------------------------------------------------ the native extension
# The extension writes and reads a push in one call each way; the Python is the reference:
# the same bytes out, the same answer (or the same error) in, whatever arrives.
from elasticdl.common import push_wire  # noqa: E402

push_wire.use_native(_backend.native)  # as the PS and the worker do where they import
NATIVE = push_wire._native
needs_native = pytest.mark.skipif(NATIVE is None, reason="elasticdl_native not loaded")


def _by_python(fn, *args):
    saved, push_wire._native = push_wire._native, None
    try:
        return fn(*args)
    finally:
        push_wire._native = saved


def _rows_of(n, dim, dtype=np.float32, start=0):
    return tu.IndexedRows(np.arange(n * dim).reshape(n, dim).astype(dtype), np.arange(n) + start)


# Sizes around the varint length boundaries (1 -> 2 bytes at 128, 2 -> 3 at 16,384): row
# counts whose content, tensor, rows and gradients fields cross them, and names of 127/128.
BOUNDARY_CASES = [
    ({}, {}),
    ({"e": _rows_of(0, 4)}, {}),
    ({}, {"w": np.ones(0, np.float32)}),
    ({}, {"scalar": np.float32(3.5)}),
    *[({"e": _rows_of(n, 1)}, {}) for n in (1, 9, 10, 11, 12, 13, 14, 15, 16, 17, 31, 32, 33)],
    *[({"e": _rows_of(n, 16)}, {}) for n in (1, 2, 255, 256, 257, 1023, 1024, 1025, 4096)],
    *[({"e": _rows_of(1, d)}, {}) for d in (31, 32, 33, 4095, 4096, 4097)],
    ({"k" * 127: _rows_of(2, 2), "k" * 128: _rows_of(2, 2)}, {"n" * 128: np.ones(3)}),
    ({"a": _rows_of(3, 2), "b": _rows_of(0, 8), "": _rows_of(1, 1), "ü": _rows_of(2, 4)}, {}),
    (
        {"a": _rows_of(5, 3, np.float64), "b": _rows_of(2, 2, np.float16, start=1 << 40)},
        {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "i": np.arange(4, dtype=np.int32)},
    ),
    (
        {"bf": _rows_of(3, 2, tu.pb_to_dtype(pb.DT_BFLOAT16))},
        {"bf": np.ones((2, 2), tu.pb_to_dtype(pb.DT_BFLOAT16))},
    ),
    # Arrays the writers normalise first: big-endian, not contiguous, ids of another int type.
    (
        {"e": tu.IndexedRows(np.ones((4, 3), ">f4"), np.arange(4, dtype=np.int32))},
        {"t": np.arange(12, dtype=np.float32).reshape(3, 4).T, "be": np.ones(2, ">f8")},
    ),
]


@needs_native
@pytest.mark.parametrize("embedding, dense", BOUNDARY_CASES)
def test_the_native_writer_writes_the_python_writers_bytes_which_protobuf_parses(embedding, dense):
    req = _request(shared_memory_region=70000)
    native = encode_push(req, embedding, dense)
    assert native == _by_python(encode_push, req, embedding, dense)
    assert pb.PushGradientsRequest.FromString(native) == _full_by_protobuf(req, embedding, dense)


def _in_host_order(array):
    array = np.asarray(array)  # ndarray_to_pb sends only host-order (little-endian) arrays
    return array.astype(array.dtype.newbyteorder("=")) if array.dtype.byteorder == ">" else array


def _full_by_protobuf(req, embedding, dense):
    full = _by_protobuf(
        req,
        {
            n: tu.IndexedRows(_in_host_order(r.values), np.asarray(r.indices))
            for n, r in embedding.items()
        },
    )
    for name, value in dense.items():
        tu.ndarray_to_pb(_in_host_order(value), full.gradients.dense_parameters[name])
    return full


@needs_native
def test_the_native_writer_leaves_string_tensors_to_the_python_writer():
    dense = {"s": np.array([b"ab", b""], dtype=object)}
    req = pb.PushGradientsRequest(worker_id=1)
    data = encode_push(req, {"e": _rows_of(2, 2)}, dense)
    assert data == _by_python(encode_push, req, {"e": _rows_of(2, 2)}, dense)
    parsed = pb.PushGradientsRequest.FromString(data).gradients.dense_parameters["s"]
    assert tu.pb_to_ndarray(parsed).tolist() == [b"ab", b""]


def _same_push(got, want):
    assert got.request == want.request
    for attr in ("embedding", "dense"):
        g, w = getattr(got, attr), getattr(want, attr)
        assert (g is None) == (w is None)
        if w is None:
            continue
        assert list(g) == list(w)
        for name in w:
            pairs = (
                [(g[name], w[name])]
                if attr == "dense"
                else [(g[name].values, w[name].values), (g[name].indices, w[name].indices)]
            )
            for a, b in pairs:
                assert a.dtype == b.dtype and a.shape == b.shape
                assert a.tobytes() == b.tobytes()


def _outcome(data):
    try:
        return decode_push(data), None
    except Exception as e:  # noqa: BLE001 - the type is what must agree
        return None, type(e)


def _assert_decoders_agree(data):
    native, native_error = _outcome(data)
    python, python_error = _by_python(_outcome, data)
    assert native_error == python_error
    if python is not None:
        _same_push(native, python)
    return native


def _field(number, body: bytes) -> bytes:
    return tu._varint(number << 3 | 2) + tu._varint(len(body)) + body


def _tensor_reordered(array) -> bytes:
    """A Tensor with its fields backwards, the dtype twice (the later wins) and the shape
    unpacked, one field per dimension."""
    array = _in_host_order(array)
    shape = b"".join(tu._varint(2 << 3) + tu._varint(d) for d in array.shape)
    return (
        _field(3, array.tobytes())
        + shape
        + bytes([1 << 3, pb.DT_INT8])
        + bytes([1 << 3, tu.dtype_to_pb(array.dtype)])
    )


def _reordered_push(tables, dense, tail=b"") -> bytes:
    """A push as another writer may lay it out: the request's fields after the gradients, the
    entries' value before their key, the ids before the rows, the gradients in two pieces."""
    table_entries = b"".join(
        _field(
            4,
            _field(
                2,
                _field(2, _tensor_reordered(rows.indices))
                + _field(1, _tensor_reordered(rows.values)),
            )
            + _field(1, name.encode()),
        )
        for name, rows in tables.items()
    )
    dense_entries = b"".join(
        _field(3, _field(2, _tensor_reordered(v)) + _field(1, n.encode())) for n, v in dense.items()
    )
    version = bytes([1 << 3 | 0, 9])  # Model.version, a varint
    return (
        _field(1, table_entries)
        + pb.PushGradientsRequest(worker_id=3, learning_rate=0.5).SerializeToString()
        + _field(1, version + dense_entries)
        + tail
    )


@needs_native
@pytest.mark.parametrize("case", range(len(BOUNDARY_CASES)))
def test_the_native_reader_reads_protobufs_and_reordered_bytes_as_the_python_reader(case):
    embedding, dense = BOUNDARY_CASES[case]
    req = _request()
    full = _full_by_protobuf(req, embedding, dense)
    for data in (full.SerializeToString(), encode_push(req, embedding, dense)):
        assert NATIVE.push_decode(data, pb.DT_STRING) is not None  # the extension read it
        push = _assert_decoders_agree(data)
        assert push.embedding is not None
        _assert_same_rows(push.embedding, embedding)
    data = _reordered_push(embedding, dense)
    assert NATIVE.push_decode(data, pb.DT_STRING) is not None
    push = _assert_decoders_agree(data)
    assert push.embedding is not None  # read by the fast path, not protobuf
    _assert_same_rows(push.embedding, embedding)
    assert push.request.worker_id == 3 and push.request.gradients.version == 9
    parsed = pb.PushGradientsRequest.FromString(data)
    for name, rows in embedding.items():
        np.testing.assert_array_equal(
            tu.pb_to_indexed_rows(parsed.gradients.embedding_tables[name]).values, rows.values
        )


@needs_native
@pytest.mark.parametrize(
    "tail",
    [
        _field(1, _field(4, _field(1, b"e") + _field(1, b"e") + _field(2, b""))),  # key twice
        _field(1, _field(4, _field(1, b"e"))),  # an entry without its rows
        _field(1, _field(4, _field(1, b"\xff") + _field(2, b""))),  # a name that is not UTF-8
        # a string Tensor
        _field(1, _field(3, _field(1, b"s") + _field(2, bytes([8, pb.DT_STRING, 26, 0])))),
        # a negative dimension (an unpacked shape of -1)
        _field(1, _field(3, _field(1, b"n") + _field(2, bytes([8, 1, 16]) + tu._varint(-1)))),
        _field(1, _field(3, _field(1, b"z") + _field(2, bytes([8, 1]) + _field(3, b"abc")))),
        _field(1, _field(3, _field(1, b"q") + _field(2, bytes([8, 99])))),  # no such dtype
        bytes([1 << 3 | 3]),  # a group's start: a wire type the reader refuses
    ],
)
def test_the_native_reader_answers_as_the_python_reader_on_what_the_fast_path_refuses(tail):
    _assert_decoders_agree(_reordered_push({"e": _rows_of(3, 2)}, {"w": np.ones(2)}, tail))


@needs_native
def test_the_native_reader_survives_truncated_and_corrupted_pushes_as_the_python_reader():
    rng = np.random.default_rng(11)
    req = _request()
    tu.ndarray_to_pb(np.full(2, 0.5, np.float32), req.gradients.state["bn/moving_mean"])
    sources = [
        encode_push(req, {"a": _rows_of(9, 3), "b": _rows_of(2, 5)}, {"v": np.ones(4)}),
        _reordered_push({"a": _rows_of(4, 2)}, {"w": np.arange(3.0)}),
    ]
    cases = 0
    for data in sources:
        for cut in range(0, len(data), max(1, len(data) // 60)):
            _assert_decoders_agree(data[:cut])
            cases += 1
        for _ in range(150):
            corrupt = bytearray(data)
            for pos in rng.integers(0, len(data), size=rng.integers(1, 4)):
                corrupt[pos] = rng.integers(0, 256)
            _assert_decoders_agree(bytes(corrupt))
            cases += 1
    assert cases > 400
