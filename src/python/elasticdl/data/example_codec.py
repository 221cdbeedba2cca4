"""Encode and decode ``tf.train.Example`` protobuf bytes without TensorFlow or protobuf.

The client and the data-preparation tools stay light (no TensorFlow import), yet the records
they write must parse with ``tf.io.parse_example`` on workers. The wire format is small:

    Example  { Features features = 1; }
    Features { map<string, Feature> feature = 1; }     # entries: key = 1, value = 2
    Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                            Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }

The encoder writes what protobuf writes (packed floats/ints, map entries in insertion order);
the decoder also accepts unpacked repeated fields, as any protobuf parser must.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Sequence, Tuple, Union

import numpy as np

BYTES = "bytes"
FLOAT = "float"
INT64 = "int64"
_KIND_FIELD = {BYTES: 1, FLOAT: 2, INT64: 3}
_FIELD_KIND = {v: k for k, v in _KIND_FIELD.items()}

_WT_VARINT = 0
_WT_I64 = 1
_WT_LEN = 2
_WT_I32 = 5


class ExampleCodecError(ValueError):
    """Bad feature values to encode, or bytes that are not a valid Example."""


@dataclass(frozen=True)
class Feature:
    """One feature: its list kind (``bytes``, ``float`` or ``int64``) and its values."""

    kind: str
    values: Tuple

    def __post_init__(self):
        if self.kind not in _KIND_FIELD:
            raise ExampleCodecError(
                f"feature kind {self.kind!r} must be one of bytes, float, int64"
            )


def bytes_feature(values: Union[bytes, str, Iterable[Union[bytes, str]]]) -> Feature:
    if isinstance(values, (bytes, bytearray, memoryview, str)):
        values = [values]
    return Feature(
        BYTES, tuple(v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in values)
    )


def float_feature(values) -> Feature:
    return Feature(FLOAT, tuple(float(v) for v in np.atleast_1d(np.asarray(values, np.float32))))


def int64_feature(values) -> Feature:
    arr = np.atleast_1d(np.asarray(values))
    if arr.size and arr.dtype.kind not in "iub":
        raise ExampleCodecError(f"int64 feature needs integers, got dtype {arr.dtype}")
    return Feature(INT64, tuple(int(v) for v in arr.astype(np.int64)))


# --- encoding ---------------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # int64 negatives: two's complement, ten bytes
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _len_field(field: int, payload: bytes) -> bytes:
    return _varint((field << 3) | _WT_LEN) + _varint(len(payload)) + payload


def _encode_feature(name: str, value) -> bytes:
    """Bytes of one Feature message (without its map-entry wrapper)."""
    if isinstance(value, Feature):
        kind, values = value.kind, value.values
    else:
        kind, values = _infer(name, value)
    if kind == BYTES:
        body = b"".join(_len_field(1, bytes(v)) for v in values)
    elif kind == FLOAT:
        packed = np.asarray(values, dtype="<f4").tobytes()
        body = _len_field(1, packed) if packed else b""
    else:
        packed = b"".join(_varint(int(v)) for v in values)
        body = _len_field(1, packed) if packed else b""
    return _len_field(_KIND_FIELD[kind], body)


def _infer(name: str, value) -> Tuple[str, Sequence]:
    """Feature kind from a plain Python/NumPy value: bytes/str, floats, or ints."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return BYTES, [bytes(value)]
    if isinstance(value, str):
        return BYTES, [value.encode("utf-8")]
    if isinstance(value, np.ndarray) and value.dtype.kind in "SUO":
        value = value.tolist()
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], (bytes, str)):
        return BYTES, bytes_feature(value).values
    arr = np.atleast_1d(np.asarray(value))
    if arr.dtype.kind in "iub":
        return INT64, arr.astype(np.int64).tolist()
    if arr.dtype.kind == "f":
        return FLOAT, arr.astype(np.float32)
    raise ExampleCodecError(
        f"feature {name!r}: cannot infer a kind from {type(value).__name__}; "
        "wrap it with bytes_feature/float_feature/int64_feature"
    )


def encode_example(features: Mapping[str, object]) -> bytes:
    """Serialize ``{name: Feature | bytes | str | number(s)}`` as ``tf.train.Example`` bytes.

    Plain values are typed by inference: bytes/str -> bytes_list, integers -> int64_list,
    floats -> float_list. Use the ``*_feature`` helpers when the inference is not what you want
    (e.g. an integer-valued column that the model reads as float).
    """
    return example_from_entries([feature_entry(n, v) for n, v in features.items()])


def feature_entry(name: str, value) -> bytes:
    """The encoded ``name -> feature`` map entry. Bulk writers cache these for repeated values
    (categorical columns, labels) and join them with :func:`example_from_entries`."""
    if not isinstance(name, str) or not name:
        raise ExampleCodecError(f"feature names must be non-empty strings, got {name!r}")
    entry = _len_field(1, name.encode("utf-8")) + _len_field(2, _encode_feature(name, value))
    return _len_field(1, entry)


def example_from_entries(entries: Iterable[bytes]) -> bytes:
    """Example bytes from map entries made by :func:`feature_entry` (names must be unique)."""
    return _len_field(1, b"".join(entries))


# --- decoding ---------------------------------------------------------------------------------


def _read_varint(buf: bytes, pos: int) -> Tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise ExampleCodecError("truncated varint in Example bytes")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ExampleCodecError("varint longer than 10 bytes in Example bytes")


def _fields(buf: bytes) -> Iterable[Tuple[int, int, object]]:
    """(field number, wire type, value) of every field; LEN values are bytes slices."""
    pos = 0
    n = len(buf)
    while pos < n:
        key, pos = _read_varint(buf, pos)
        field, wt = key >> 3, key & 7
        if wt == _WT_VARINT:
            value, pos = _read_varint(buf, pos)
        elif wt == _WT_LEN:
            length, pos = _read_varint(buf, pos)
            if pos + length > n:
                raise ExampleCodecError("length-delimited field runs past the end of the Example")
            value = buf[pos : pos + length]
            pos += length
        elif wt == _WT_I32:
            value = buf[pos : pos + 4]
            pos += 4
        elif wt == _WT_I64:
            value = buf[pos : pos + 8]
            pos += 8
        else:
            raise ExampleCodecError(f"unsupported wire type {wt} in Example bytes")
        if pos > n:
            raise ExampleCodecError("field runs past the end of the Example")
        yield field, wt, value


def _to_int64(u: int) -> int:
    return u - (1 << 64) if u >= 1 << 63 else u


def _decode_list(kind: str, buf: bytes) -> Tuple:
    values: List = []
    for field, wt, value in _fields(buf):
        if field != 1:
            continue
        if kind == BYTES:
            values.append(bytes(value))
        elif kind == FLOAT:
            if wt == _WT_LEN:
                values.extend(np.frombuffer(value, dtype="<f4").tolist())
            else:
                values.append(struct.unpack("<f", value)[0])
        else:
            if wt == _WT_LEN:
                pos = 0
                while pos < len(value):
                    v, pos = _read_varint(value, pos)
                    values.append(_to_int64(v))
            else:
                values.append(_to_int64(value))
    return tuple(values)


def decode_example(data: bytes) -> Dict[str, Feature]:
    """Parse ``tf.train.Example`` bytes into ``{name: Feature}``."""
    data = bytes(data)
    out: Dict[str, Feature] = {}
    for f1, wt1, features in _fields(data):
        if f1 != 1 or wt1 != _WT_LEN:
            continue
        for f2, wt2, entry in _fields(features):
            if f2 != 1 or wt2 != _WT_LEN:
                continue
            name = b""
            feature = Feature(BYTES, ())  # a map entry without value is an empty Feature
            for f3, wt3, v in _fields(entry):
                if f3 == 1 and wt3 == _WT_LEN:
                    name = bytes(v)
                elif f3 == 2 and wt3 == _WT_LEN:
                    for f4, wt4, lst in _fields(v):
                        if f4 in _FIELD_KIND and wt4 == _WT_LEN:
                            kind = _FIELD_KIND[f4]
                            feature = Feature(kind, _decode_list(kind, lst))
            out[name.decode("utf-8")] = feature
    return out


def decode_example_values(data: bytes) -> Dict[str, Tuple]:
    """Like :func:`decode_example` but only the values: ``{name: (v, ...)}``."""
    return {k: f.values for k, f in decode_example(data).items()}
