import numpy as np
import pytest
from elasticdl.common import tensor_utils as tu
from elasticdl.common.hash_utils import scatter_embedding_vector, string_to_id
from elasticdl.proto import elasticdl_pb2 as pb


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float64, np.int32, np.int64, np.float16, np.bool_]
)
def test_ndarray_round_trip(dtype):
    a = (np.arange(24).reshape(2, 3, 4) % 2).astype(dtype)
    msg = pb.Tensor.FromString(tu.ndarray_to_pb(a).SerializeToString())
    b = tu.pb_to_ndarray(msg)
    assert b.dtype == a.dtype and b.shape == a.shape
    np.testing.assert_array_equal(a, b)


def test_scalar_and_strings():
    np.testing.assert_array_equal(tu.pb_to_ndarray(tu.ndarray_to_pb(np.float32(2.5))), 2.5)
    s = np.array([b"a", b"", b"xyz"], dtype=object)
    assert list(tu.pb_to_ndarray(tu.ndarray_to_pb(s))) == [b"a", b"", b"xyz"]


def test_content_size_mismatch_is_rejected():
    msg = tu.ndarray_to_pb(np.zeros((2, 2), np.float32))
    msg.content = msg.content[:-1]
    with pytest.raises(ValueError, match="needs 16"):
        tu.pb_to_ndarray(msg)


def test_indexed_rows_round_trip():
    rows = tu.IndexedRows(values=np.ones((3, 2), np.float32), indices=np.array([5, 1, 5]))
    back = tu.pb_to_indexed_rows(tu.indexed_rows_to_pb(rows))
    np.testing.assert_array_equal(back.values, rows.values)
    np.testing.assert_array_equal(back.indices, [5, 1, 5])
    with pytest.raises(ValueError):
        tu.indexed_rows_to_pb(tu.IndexedRows(values=np.ones((2, 2)), indices=np.array([1])))


def test_string_to_id_matches_original_quirk():
    # int(sha256(name).hexdigest(), base=32) % n, as the original computed it.
    import hashlib

    for name in ["dense/kernel:0", "x", "embedding"]:
        expect = int(hashlib.sha256(name.encode()).hexdigest(), 32) % 3
        assert string_to_id(name, 3) == expect


def test_scatter_embedding_vector_groups_by_id_mod_n():
    values = np.arange(10, dtype=np.float32).reshape(5, 2)
    ids = np.array([0, 3, 1, 4, 6])
    out = scatter_embedding_vector(values, ids, 2)
    np.testing.assert_array_equal(out[0][1], [0, 4, 6])
    np.testing.assert_array_equal(out[1][1], [3, 1])
    np.testing.assert_array_equal(out[1][0], values[[1, 2]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int8, np.bool_])
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 300), (0, 16), (70000, 2)])
def test_tensor_bytes_are_the_protobuf_encoding(dtype, shape):
    a = (np.arange(int(np.prod(shape))).reshape(shape) % 7).astype(dtype)
    raw = tu.ndarray_to_tensor_bytes(a)
    # Both ways interchangeable with the generated protobuf code.
    parsed = tu.pb_to_ndarray(pb.Tensor.FromString(raw))
    assert parsed.dtype == a.dtype and parsed.shape == a.shape
    np.testing.assert_array_equal(parsed, a)
    b = tu.tensor_bytes_to_ndarray(tu.ndarray_to_pb(a).SerializeToString())
    assert b.dtype == a.dtype and b.shape == a.shape and not b.flags.writeable
    np.testing.assert_array_equal(b, a)
    np.testing.assert_array_equal(tu.tensor_bytes_to_ndarray(raw), a)


def test_tensor_bytes_of_non_contiguous_and_string_arrays():
    a = np.arange(40, dtype=np.float32).reshape(8, 5)[:, 1:3]
    np.testing.assert_array_equal(tu.tensor_bytes_to_ndarray(tu.ndarray_to_tensor_bytes(a)), a)
    s = np.array([b"a", b"xyz"], dtype=object)
    assert list(tu.tensor_bytes_to_ndarray(tu.ndarray_to_tensor_bytes(s))) == [b"a", b"xyz"]


def test_bad_tensor_bytes_are_refused():
    raw = tu.ndarray_to_tensor_bytes(np.zeros((4, 4), np.float32))
    with pytest.raises(ValueError, match="end inside"):
        tu.tensor_bytes_to_ndarray(raw[:-3])
    msg = tu.ndarray_to_pb(np.zeros((2, 2), np.float32))
    msg.content = msg.content[:-4]
    with pytest.raises(ValueError, match="needs 16"):
        tu.tensor_bytes_to_ndarray(msg.SerializeToString())


def test_tensor_bytes_in_other_layouts_read_as_protobuf_reads_them():
    """What the writers write is read by the one-pass layout; any other valid encoding (fields
    in another order, a field twice, one not read here) field by field, to protobuf's answer."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    raw = tu.ndarray_to_tensor_bytes(a)
    assert tu._written_layout(memoryview(raw)) is not None
    dtype = b"\x08" + tu._varint(tu.dtype_to_pb(a.dtype))
    shape = b"\x12\x02\x02\x03"
    content = b"\x1a" + tu._varint(a.nbytes) + a.tobytes()
    unknown = b"\x78\x01"  # field 15, a varint
    wrong_shape = b"\x12\x02\x06\x01"
    for data in (
        content + shape + dtype,
        dtype + content + shape,
        dtype + shape + content + unknown,
        unknown + dtype + shape + content,
        dtype + b"\x12\x01\x02" + b"\x12\x01\x03" + content,  # packed shape in two pieces
        dtype + wrong_shape + dtype + content,
    ):
        assert tu._written_layout(memoryview(data)) is None
        got, want = tu.tensor_bytes_to_ndarray(data), tu.pb_to_ndarray(pb.Tensor.FromString(data))
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="needs"):  # a negative dimension, as before
        tu.tensor_bytes_to_ndarray(dtype + b"\x12\x0a" + tu._varint(-1) + content)


# Every varint length and the boundaries between them, negatives (10 bytes) included.
_VARINTS = [0, 1, 0x7F, 0x80, 300, 0x3FFF, 0x4000, 65536, 0x1FFFFF, 0x200000, 0xFFFFFFF]
_VARINTS += [0x10000000, 2**32, 2**63 - 1, -1, -300, -(2**63)]


@pytest.mark.parametrize("value", _VARINTS)
def test_varints_are_protobufs_and_read_back(value):
    from google.protobuf.internal.encoder import _VarintBytes

    expected = _VarintBytes(value & (2**64 - 1))
    assert tu._varint(value) == expected
    data = b"\x05" + expected + b"\x07"  # a varint between other bytes, and one that ends them
    assert tu._read_varint(data, 1) == (value & (2**64 - 1), 1 + len(expected))
    assert tu._read_varint(data[:-1], 1) == (value & (2**64 - 1), len(data) - 1)


def test_truncated_varints_are_refused():
    for data in (b"\x80", b"\xff\xff", b"\x05\x80"):
        with pytest.raises(ValueError, match="inside a varint"):
            tu._read_varint(data, len(data) - 1 if data == b"\x05\x80" else 0)


def test_an_aligned_copy_starts_at_64_bytes_and_owns_its_values():
    raw = np.arange(40, dtype=np.float32)
    for source in (raw[1:34], raw.reshape(5, 8)):  # a view 4 bytes in; a 2-D array
        copy = tu.aligned_copy(source)
        assert copy.ctypes.data % tu.ALIGNMENT == 0 and copy.dtype == np.float32
        np.testing.assert_array_equal(copy, source.reshape(-1))
        assert not np.shares_memory(copy, raw)
