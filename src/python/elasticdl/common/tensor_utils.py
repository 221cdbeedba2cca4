"""Conversions between NumPy arrays and the wire `Tensor` / `IndexedSlices` messages.

Tensors travel as raw C-contiguous little-endian bytes (see protos/elasticdl/proto): decoding is
a zero-copy `np.frombuffer` view of the message bytes, so decoded arrays are read-only; callers
that mutate must copy.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from elasticdl.proto import elasticdl_pb2 as pb

_NP_TO_PB = {
    np.dtype(np.float32): pb.DT_FLOAT32,
    np.dtype(np.float64): pb.DT_FLOAT64,
    np.dtype(np.int32): pb.DT_INT32,
    np.dtype(np.int64): pb.DT_INT64,
    np.dtype(np.float16): pb.DT_FLOAT16,
    np.dtype(np.bool_): pb.DT_BOOL,
    np.dtype(np.int8): pb.DT_INT8,
    np.dtype(np.uint8): pb.DT_UINT8,
}
_PB_TO_NP = {v: k for k, v in _NP_TO_PB.items()}

try:  # bfloat16 comes with ml_dtypes (a TensorFlow dependency); optional for the light client
    import ml_dtypes

    _NP_TO_PB[np.dtype(ml_dtypes.bfloat16)] = pb.DT_BFLOAT16
    _PB_TO_NP[pb.DT_BFLOAT16] = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    pass


# TensorFlow's CPU allocator alignment: a NumPy input aligned to it becomes a tensor without
# being copied.
ALIGNMENT = 64


def aligned_empty(size: int, dtype) -> np.ndarray:
    """An uninitialised 1-D array of `size` elements whose data starts at a 64-byte boundary."""
    dtype = np.dtype(dtype)
    raw = np.empty(size * dtype.itemsize + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + size * dtype.itemsize].view(dtype)


def aligned_copy(a: np.ndarray) -> np.ndarray:
    """A 1-D copy of `a` whose data starts at a 64-byte boundary."""
    out = aligned_empty(a.size, a.dtype)
    np.copyto(out, a.reshape(-1))
    return out


def dtype_to_pb(dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype.kind in ("S", "O", "U"):
        return pb.DT_STRING
    try:
        return _NP_TO_PB[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} cannot be sent as a Tensor") from None


def pb_to_dtype(dtype: int) -> np.dtype:
    try:
        return _PB_TO_NP[dtype]
    except KeyError:
        raise TypeError(f"Tensor dtype {pb.DataType.Name(dtype)} has no NumPy equivalent") from None


def _encode_strings(values: Sequence[bytes]) -> bytes:
    parts = []
    for v in values:
        if isinstance(v, str):
            v = v.encode()
        parts.append(struct.pack("<I", len(v)))
        parts.append(bytes(v))
    return b"".join(parts)


def _decode_strings(content: bytes, count: int) -> np.ndarray:
    out = np.empty(count, dtype=object)
    pos = 0
    for i in range(count):
        (n,) = struct.unpack_from("<I", content, pos)
        pos += 4
        out[i] = content[pos : pos + n]
        pos += n
    return out


def ndarray_to_pb(array, out: pb.Tensor | None = None) -> pb.Tensor:
    """Serialize an array (anything np.asarray accepts, incl. eager tf.Tensors) into a Tensor."""
    tensor = out if out is not None else pb.Tensor()
    array = np.asarray(array)
    tensor.shape[:] = array.shape
    tensor.dtype = dtype_to_pb(array.dtype)
    if tensor.dtype == pb.DT_STRING:
        tensor.content = _encode_strings(array.reshape(-1).tolist())
    else:
        array = np.ascontiguousarray(array)
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        tensor.content = array.tobytes()
    return tensor


def pb_to_ndarray(tensor: pb.Tensor) -> np.ndarray:
    """Decode a Tensor; numeric results are read-only views of the message bytes."""
    shape = tuple(tensor.shape)
    if tensor.dtype == pb.DT_STRING:
        count = math.prod(shape)
        return _decode_strings(tensor.content, count).reshape(shape)
    dtype = pb_to_dtype(tensor.dtype)
    expected = math.prod(shape) * dtype.itemsize  # Python ints: no overflow, no NumPy call
    # Each read of a bytes field copies it out of the message (upb): read it once.
    content = tensor.content
    if len(content) != expected:
        raise ValueError(
            f"Tensor content is {len(content)} bytes but shape {list(shape)} of "
            f"{dtype} needs {expected}"
        )
    return np.frombuffer(content, dtype=dtype).reshape(shape)


@dataclass
class IndexedRows:
    """Rows of a table (values[i] is row indices[i]); the in-memory form of IndexedSlices."""

    values: np.ndarray  # (n, dim)
    indices: np.ndarray  # (n,) int64


def checked_indexed_rows(rows: IndexedRows) -> tuple[np.ndarray, np.ndarray]:
    """(values, int64 indices) of `rows`, ValueError unless there is one row per index."""
    values = np.asarray(rows.values)
    indices = np.asarray(rows.indices, dtype=np.int64).reshape(-1)
    if values.ndim == 0 or values.shape[0] != indices.shape[0]:
        raise ValueError(
            f"IndexedSlices has {indices.shape[0]} indices but values of shape {values.shape}"
        )
    return values, indices


def indexed_rows_to_pb(rows: IndexedRows, out: pb.IndexedSlices | None = None) -> pb.IndexedSlices:
    msg = out if out is not None else pb.IndexedSlices()
    values, indices = checked_indexed_rows(rows)
    ndarray_to_pb(values, msg.values)
    ndarray_to_pb(indices, msg.indices)
    return msg


def indexed_rows_of(values: np.ndarray, indices: np.ndarray) -> IndexedRows:
    """Decoded values and indices as IndexedRows (int64 indices), ValueError unless there is
    one row per index."""
    if indices.dtype != np.int64:
        indices = indices.astype(np.int64)
    if values.shape[:1] != indices.shape:
        raise ValueError(
            f"IndexedSlices has {indices.shape[0]} indices but values of shape {values.shape}"
        )
    return IndexedRows(values=values, indices=indices)


def pb_to_indexed_rows(msg: pb.IndexedSlices) -> IndexedRows:
    return indexed_rows_of(pb_to_ndarray(msg.values), pb_to_ndarray(msg.indices))


# ------------------------------------------------------------------ Tensor wire bytes
# A large Tensor through protobuf is copied three times on the way out (tobytes, into the
# message, SerializeToString) and twice on the way in (the parsed message, its content field).
# For the hot pull of embedding rows the PS writes the serialized Tensor itself (one copy) and
# the worker decodes it as a view of the received bytes (none); the bytes are the same
# protobuf encoding, so a generated stub or servicer on the other end still reads them.
_TENSOR_DTYPE, _TENSOR_SHAPE, _TENSOR_CONTENT = 1, 2, 3
_VARINT, _LEN = 0, 2
_ONE_BYTE = [bytes([i]) for i in range(0x80)]


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:  # tags, dtypes, small sizes: one byte
        return _ONE_BYTE[value]
    # Sizes of a push's or pull's fields and row counts: two to four bytes, written at once
    # (each call of a message's encoding writes a dozen of them).
    if 0 < value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    if 0 < value < 0x200000:
        return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
    if 0 < value < 0x10000000:
        return bytes(
            (value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14 & 0x7F | 0x80, value >> 21)
        )
    value &= (1 << 64) - 1  # negative int64 values as protobuf encodes them (10 bytes)
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data, pos: int) -> tuple[int, int]:
    if pos + 1 < len(data):
        first = data[pos]
        if first < 0x80:  # one byte: tags, dtypes, small sizes
            return first, pos + 1
        second = data[pos + 1]
        if second < 0x80:  # two bytes: row counts and sizes below 16 KB
            return first & 0x7F | second << 7, pos + 2
    elif pos < len(data) and data[pos] < 0x80:  # a one-byte varint that ends the data
        return data[pos], pos + 1
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("Tensor bytes end inside a varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def ndarray_to_tensor_bytes(array) -> bytes:
    """The serialized `Tensor` of a numeric array, as `ndarray_to_pb(a).SerializeToString()`
    parses, with the array's bytes copied once."""
    return b"".join(ndarray_to_tensor_pieces(array))


def tensor_parts(array) -> tuple[int, tuple, np.ndarray]:
    """(DataType, dimensions, C-contiguous little-endian array) of what a `Tensor` of `array`
    holds; the array is not copied when it already is so."""
    array = np.asarray(array)
    dims = array.shape  # before ascontiguousarray, which makes a 0-d array 1-d
    array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return dtype_to_pb(array.dtype), dims, array


def ndarray_to_tensor_pieces(array) -> list:
    """The serialized `Tensor` of an array as pieces to join: its head, then a view of its
    bytes (no copy yet) when it is numeric."""
    dtype, dims, array = tensor_parts(array)
    if dtype == pb.DT_STRING:
        return [ndarray_to_pb(array).SerializeToString()]
    shape = b"".join(_varint(d) for d in dims)
    head = [_varint(_TENSOR_DTYPE << 3 | _VARINT), _varint(dtype)]
    if shape:
        head += [_varint(_TENSOR_SHAPE << 3 | _LEN), _varint(len(shape)), shape]
    if not array.nbytes:
        return [b"".join(head)]
    head += [_varint(_TENSOR_CONTENT << 3 | _LEN), _varint(array.nbytes)]
    # Bytes through a uint8 view: a memoryview of bfloat16 (ml_dtypes) cannot be cast.
    return [b"".join(head), memoryview(array.reshape(-1).view(np.uint8))]


def tensor_bytes_to_ndarray(data: bytes) -> np.ndarray:
    """Decode a serialized `Tensor` of a numeric dtype as a read-only view of `data` (falls back
    to the protobuf parser for strings); ValueError for bytes that are no such Tensor."""
    view = memoryview(data)
    layout = _written_layout(view)
    dtype, shape, content = layout if layout is not None else _tensor_fields(view)
    if dtype == pb.DT_STRING:
        return pb_to_ndarray(pb.Tensor.FromString(bytes(data)))
    return tensor_view(view, dtype, shape, *content)


def tensor_view(view: memoryview, dtype: int, shape, start: int, end: int) -> np.ndarray:
    """The numeric Tensor of DataType `dtype` and `shape` whose content is view[start:end], as
    a read-only view; ValueError when the content's size does not fit the shape."""
    np_dtype = pb_to_dtype(dtype)
    expected = math.prod(shape) * np_dtype.itemsize
    if end - start != expected:
        raise ValueError(
            f"Tensor content is {end - start} bytes but shape {shape} of {np_dtype} needs "
            f"{expected}"
        )
    return np.frombuffer(view[start:end], dtype=np_dtype).reshape(shape)


_DTYPE_TAG = _TENSOR_DTYPE << 3 | _VARINT
_SHAPE_TAG = _TENSOR_SHAPE << 3 | _LEN
_CONTENT_TAG = _TENSOR_CONTENT << 3 | _LEN


def _written_layout(view: memoryview):
    """(dtype, shape, content span) of a Tensor laid out as `ndarray_to_tensor_pieces` and
    protobuf write a numeric one: a one-byte dtype, the packed shape, the content to the end,
    each once and in that order. None for anything else, which `_tensor_fields` reads (the
    same answer, field by field: several times the Python per call, and a push carries two)."""
    n = len(view)
    if n < 4 or view[0] != _DTYPE_TAG or view[1] >= 0x80:
        return None
    dtype, pos, shape = view[1], 2, []
    if view[pos] == _SHAPE_TAG:
        size, pos = _read_varint(view, pos + 1)
        end = pos + size
        if end > n:
            return None
        while pos < end:
            value, pos = _read_varint(view, pos)
            if value >> 63:  # a negative dimension: _tensor_fields reports it
                return None
            shape.append(value)
        if pos != end:
            return None
    if pos >= n or view[pos] != _CONTENT_TAG:
        return None
    size, pos = _read_varint(view, pos + 1)
    if pos + size != n:
        return None
    return dtype, shape, (pos, n)


def _tensor_fields(view: memoryview):
    """(dtype, shape, content span) of the Tensor in `view`, read field by field in any order
    (a later occurrence wins, repeated shapes add up: protobuf's merge)."""
    pos, dtype, shape, content = 0, pb.DT_INVALID, [], (0, 0)
    while pos < len(view):
        key, pos = _read_varint(view, pos)
        field, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _read_varint(view, pos)
            if field == _TENSOR_DTYPE:
                dtype = value
            elif field == _TENSOR_SHAPE:  # unpacked repeated encoding
                shape.append(value - (1 << 64) if value >> 63 else value)
        elif wire == _LEN:
            size, pos = _read_varint(view, pos)
            end = pos + size
            if end > len(view):
                raise ValueError("Tensor bytes end inside a field")
            if field == _TENSOR_SHAPE:
                while pos < end:
                    value, pos = _read_varint(view, pos)
                    shape.append(value - (1 << 64) if value >> 63 else value)
            elif field == _TENSOR_CONTENT:
                content = (pos, end)
            pos = end
        elif wire == 5:
            pos += 4
        elif wire == 1:
            pos += 8
        else:
            raise ValueError(f"Tensor bytes hold an unexpected wire type {wire}")
    return dtype, shape, content
