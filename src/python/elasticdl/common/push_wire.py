"""A `PushGradientsRequest`'s gradients written and read without protobuf's copies.

Through protobuf the gradients of a push (embedding rows, and the dense tensors when they travel
in the message) are copied three times on the way out (`tobytes`, into the message,
`SerializeToString`) and twice on the way in (the parsed message, its `content` field). Here the
worker writes them once (`encode_push`) and the PS reads them as views of the received bytes
(`decode_push`). The answer that carries the pulled parameters back goes the same way: the PS
writes them once (`DensePull`, `push_answer_pieces`), the worker reads them as views
(`decode_push_answer`). Asked for one block (`pull_dense_packed`), the PS writes them back to
back, at an offset of the answer that is a multiple of 64 bytes (`tensor_utils.ALIGNMENT`,
TensorFlow's CPU allocator alignment): a worker that reads the answer into a buffer so aligned
gives that block to its step as it is, without reading a field per tensor or copying them into
a block of its own.

The bytes are the protobuf encoding of the same request: the message without those gradients,
serialized by protobuf, followed by a second `gradients` field that holds only them. A parser
merges repeated occurrences of a message field, so a generated servicer reads the whole
request, and `decode_push` reads what a generated stub sends: anything it does not expect (a
field repeated inside a map entry, a field it does not know there) makes it parse the request
with protobuf instead, so its answer is always protobuf's.

Both ways run in one call of the native extension (`elasticdl_native.push_encode`,
`push_decode`) once the PS and the worker plug the extension elasticdl.ops loaded in here
(`use_native`: common imports nothing above it, and elasticdl.ops imports no protobuf, so
that it loads in an image without it), instead of some thirty Python steps that frame
each varint and nested field; the Python below is the reference they match byte for byte, and
what serves without the extension or with ELASTICDL_OPS_BACKEND=reference.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional

import numpy as np
from elasticdl.common import tensor_utils as tu
from elasticdl.proto import elasticdl_pb2 as pb

# The native extension, or None: then the Python below writes and reads every push.
_native = None


def use_native(module) -> None:
    """Write and read pushes through ``module`` (the loaded ``elasticdl_native``; None: the
    Python below). Called by the modules that push and serve pushes, where they import."""
    global _native
    _native = module


_LEN = 2


def _number(message, name: str) -> int:
    return message.DESCRIPTOR.fields_by_name[name].number


_GRADIENTS = _number(pb.PushGradientsRequest, "gradients")
_TABLES = _number(pb.Model, "embedding_tables")
_DENSE = _number(pb.Model, "dense_parameters")
_ANSWER_PULL = _number(pb.PushGradientsResponse, "dense_parameters")
_PULLED = _number(pb.PullDenseParametersResponse, "dense_parameters")
_PACKED_PADDING = _number(pb.PullDenseParametersResponse, "packed_padding")
_PACKED_VALUES = _number(pb.PullDenseParametersResponse, "packed_values")
_VALUES = _number(pb.IndexedSlices, "values")
_INDICES = _number(pb.IndexedSlices, "indices")
_KEY, _VALUE = 1, 2  # every map entry's fields
_NONE: Mapping = {}


@dataclass
class DecodedPush:
    """A push as the PS reads it: the request (without the gradients in `embedding` and
    `dense` when those were read as views), each table's gradient rows and the dense
    gradients by name (both None when protobuf parsed the whole request)."""

    request: pb.PushGradientsRequest
    embedding: Optional[Dict[str, tu.IndexedRows]] = field(default=None)
    dense: Optional[Dict[str, np.ndarray]] = field(default=None)


# ------------------------------------------------------------------ writing
# The tags of the length-delimited fields written here (all numbered below 16: one byte).
_TAGS = [tu._varint(number << 3 | _LEN) for number in range(16)]


def _tag(number: int) -> bytes:
    return _TAGS[number] if number < 16 else tu._varint(number << 3 | _LEN)


def _field(number: int, pieces: List, size: int) -> tuple[List, int]:
    """A length-delimited field around `pieces` (of `size` bytes in all)."""
    head = _tag(number) + tu._varint(size)
    return [head] + pieces, len(head) + size


def _tensor(number: int, array) -> tuple[List, int]:
    pieces = tu.ndarray_to_tensor_pieces(array)
    return _field(number, pieces, sum(map(len, pieces)))  # bytes, or 1-D byte views


def _key(name: str) -> tuple[List, int]:
    key = name.encode()
    return _field(_KEY, [key], len(key))


def _tensor_map(number: int, tensors: Mapping[str, np.ndarray]) -> tuple[List, int]:
    """The entries of map<string, Tensor> field `number` (views of the arrays' bytes)."""
    entries, size = [], 0
    for name, array in tensors.items():
        key, key_size = _key(name)
        value, value_size = _tensor(_VALUE, array)
        entry, entry_size = _field(number, key + value, key_size + value_size)
        entries += entry
        size += entry_size
    return entries, size


def encode_push(
    request: pb.PushGradientsRequest,
    embedding: Mapping[str, tu.IndexedRows],
    dense: Mapping[str, np.ndarray] = _NONE,
) -> bytes:
    """`request` with `embedding` (table -> rows, ids) and `dense` (name -> gradient) added to
    its gradients, serialized; the arrays are copied once. The request itself must not hold
    those tables or tensors."""
    if _native is not None:
        encoded = _encode_native(request, embedding, dense)
        if encoded is not None:
            return encoded
    return _encode_python(request, embedding, dense)


def _encode_native(request, embedding, dense) -> Optional[bytes]:
    """The bytes of `encode_push`, written by the extension; None for a string tensor, which
    only the Python writes (protobuf lays it out)."""
    dense_entries = []
    for name, array in dense.items():
        dtype, dims, array = tu.tensor_parts(array)
        if dtype == pb.DT_STRING:
            return None
        dense_entries.append((name.encode(), dtype, dims, array))
    tables = []
    for name, rows in embedding.items():
        values, indices = tu.checked_indexed_rows(rows)
        values_dtype, values_dims, values = tu.tensor_parts(values)
        if values_dtype == pb.DT_STRING:
            return None
        indices_dtype, indices_dims, indices = tu.tensor_parts(indices)
        tables.append(
            (name.encode(), values_dtype, values_dims, values, indices_dtype, indices_dims, indices)
        )
    return _native.push_encode(request.SerializeToString(), dense_entries, tables)


def _encode_python(request, embedding, dense) -> bytes:
    entries, size = _tensor_map(_DENSE, dense)
    for name, rows in embedding.items():
        values, indices = tu.checked_indexed_rows(rows)
        key, key_size = _key(name)
        v, v_size = _tensor(_VALUES, values)
        i, i_size = _tensor(_INDICES, indices)
        slices, slices_size = _field(_VALUE, v + i, v_size + i_size)
        entry, entry_size = _field(_TABLES, key + slices, key_size + slices_size)
        entries += entry
        size += entry_size
    head = [request.SerializeToString()]
    if not entries:
        return head[0]
    tables, _ = _field(_GRADIENTS, entries, size)
    return b"".join(head + tables)


# ------------------------------------------------------------------ the PS's answer
@dataclass
class DensePull:
    """The dense parameters a push's answer carries: `message` (the answer's
    PullDenseParametersResponse) without them, and, written by `write` with one copy (under the
    model lock: the parameters change after it), either their serialized map entries in
    `tensors` or, when the push asked for one block in the layout they have (`packed`, its
    digest), that block in `values` (their names and dtype go in `message`)."""

    message: pb.PullDenseParametersResponse
    tensors: bytes = b""
    packed: bytes = b""  # the push's pull_dense_packed: the worker's layout digest
    values: Optional[np.ndarray] = None

    def write(self, params: Mapping[str, np.ndarray]) -> None:
        names = sorted(params)
        if self.packed and self.packed == _packable_digest(params):
            self.values = np.concatenate([params[n].reshape(-1) for n in names])
            self.message.packed_names.extend(names)
            self.message.packed_dtype = tu.dtype_to_pb(self.values.dtype)
            return
        entries, _ = _tensor_map(_PULLED, params)
        self.tensors = b"".join(entries)


def packed_layout_digest(specs: Mapping[str, tuple]) -> bytes:
    """What a packed block's layout depends on, digested: the tensors' names, dtypes and shapes
    (name -> (dtype, shape)); the worker sends it with a push, the PS packs when its own match."""
    canonical = repr(
        [
            (name, np.dtype(dtype).str, tuple(int(d) for d in shape))
            for name, (dtype, shape) in sorted(specs.items())
        ]
    )
    return hashlib.blake2b(canonical.encode(), digest_size=16).digest()


# A PS's digests by its parameters' (name, dtype, shape): computed once, not per push.
_DIGESTS: Dict[tuple, bytes] = {}
_DIGESTS_KEPT = 8


def _packable_digest(params: Mapping[str, np.ndarray]) -> bytes:
    """The layout digest of `params` when they can travel as one block (some, all of one
    numeric dtype of the wire's: little-endian, as the wire's tensors are); else b""."""
    key = tuple((n, a.dtype, a.shape) for n, a in params.items())
    digest = _DIGESTS.get(key)
    if digest is None:
        dtypes = {dtype for _, dtype, _ in key}
        digest = b""
        if len(dtypes) == 1 and dtypes.pop() in tu._NP_TO_PB:
            digest = packed_layout_digest({n: (dtype, shape) for n, dtype, shape in key})
        if len(_DIGESTS) >= _DIGESTS_KEPT:
            _DIGESTS.clear()
        _DIGESTS[key] = digest
    return digest


def push_answer_pieces(answer: pb.PushGradientsResponse, pull: Optional[DensePull]) -> List:
    """`answer` serialized with `pull`'s tensors in its dense_parameters (the PS's side of
    the same protobuf merge as `encode_push`), as pieces whose concatenation is those bytes: a
    channel writes them as they are, the tensors without another copy. A packed block starts
    at an offset of the concatenation that is a multiple of `tu.ALIGNMENT`."""
    head = answer.SerializeToString()
    if pull is not None and pull.values is not None:
        return [head, *_aligned_block(len(head), pull.values)]
    if pull is None or not pull.tensors:
        return [head]
    return [head, _tag(_ANSWER_PULL) + tu._varint(len(pull.tensors)), pull.tensors]


def _aligned_block(start: int, values: np.ndarray) -> List:
    """The pieces of one more dense_parameters field after `start` bytes: `packed_padding`, then
    `values` as `packed_values` at an offset that is a multiple of `tu.ALIGNMENT`."""
    data = memoryview(values.view(np.uint8))
    values_head = _tag(_PACKED_VALUES) + tu._varint(data.nbytes)
    pad = 0
    while True:  # at most twice more: the padding stays under 128 bytes, one byte of length
        inner = 2 + pad + len(values_head) + data.nbytes
        outer_head = _tag(_ANSWER_PULL) + tu._varint(inner)
        offset = start + len(outer_head) + 2 + pad + len(values_head)
        if offset % tu.ALIGNMENT == 0:
            break
        pad += -offset % tu.ALIGNMENT
    padding = _tag(_PACKED_PADDING) + bytes((pad,)) + bytes(pad)
    return [outer_head + padding + values_head, data]


@dataclass
class PushAnswer:
    """A push's answer as the worker reads it: the message without the dense parameters it
    carried in the usual layout, and those parameters as views of the answer's bytes (None:
    protobuf parsed the whole answer, and the parameters are in the message); or, when they came
    as one block, that block's bytes in `packed` (a view of the answer's; their names and dtype
    are in the message's dense_parameters)."""

    message: pb.PushGradientsResponse
    pulled: Optional[Dict[str, np.ndarray]] = None
    packed: Optional[memoryview] = None


def _decode_answer_python(data) -> PushAnswer:
    view = memoryview(data)
    pulled: Dict[str, np.ndarray] = {}
    packed: List[memoryview] = []

    def take(number: int, start: int, end: int) -> bool:
        if number == _PULLED:
            name, value = _entry(view, start, end)
            pulled[name] = tu.tensor_bytes_to_ndarray(view[slice(*value)])  # a later entry wins
        elif number == _PACKED_VALUES:
            packed.append(view[start:end])  # a later occurrence wins
        else:
            return False  # the padding too: protobuf reads it (under 128 bytes)
        return True

    rest = _split_out(view, _ANSWER_PULL, take)
    return PushAnswer(
        pb.PushGradientsResponse.FromString(rest), pulled, packed[-1] if packed else None
    )


def decode_push_answer(data) -> PushAnswer:
    """The answer to a push in `data` (bytes, or a channel frame's buffer), its pulled dense
    parameters as views of `data` (read-only for bytes) where they are laid out as usual, or
    their block's bytes; anything else is parsed by protobuf, whose answer this always is."""
    try:
        return _decode_answer_python(data)
    except (_Unexpected, ValueError, TypeError, UnicodeDecodeError):  # TypeError: a bad dtype
        return PushAnswer(pb.PushGradientsResponse.FromString(bytes(data)))


# ------------------------------------------------------------------ reading
class _Unexpected(Exception):
    """Bytes the fast path does not read: protobuf parses them instead."""


def _fields(view: memoryview, start: int, end: int):
    """(number, wire type, field start, value start, value end) of every field in
    view[start:end]; the field start is where its tag begins."""
    pos = start
    while pos < end:
        field_start = pos
        key, pos = tu._read_varint(view, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, value_end = tu._read_varint(view, pos)
        elif wire == _LEN:
            size, pos = tu._read_varint(view, pos)
            value_end = pos + size
        elif wire == 1:
            value_end = pos + 8
        elif wire == 5:
            value_end = pos + 4
        else:
            raise _Unexpected(f"wire type {wire}")
        if value_end > end:
            raise _Unexpected("a field runs past its message")
        yield number, wire, field_start, pos, value_end
        pos = value_end


def _once(view: memoryview, start: int, end: int, wanted) -> Dict[int, tuple[int, int]]:
    """Where each of the `wanted` length-delimited fields lies in view[start:end]; any other
    field, or one of them twice, is unexpected."""
    found: Dict[int, tuple[int, int]] = {}
    for number, wire, _, value_start, value_end in _fields(view, start, end):
        if number not in wanted or wire != _LEN or number in found:
            raise _Unexpected(f"field {number}")
        found[number] = (value_start, value_end)
    return found


def _entry(view: memoryview, start: int, end: int) -> tuple[str, tuple[int, int]]:
    """A map entry's key and where its value lies."""
    entry = _once(view, start, end, (_KEY, _VALUE))
    if _VALUE not in entry:
        raise _Unexpected("a map entry without a value")
    return str(view[slice(*entry.get(_KEY, (0, 0)))], "utf-8"), entry[_VALUE]


def _table(view: memoryview, start: int, end: int) -> tuple[str, tu.IndexedRows]:
    name, value = _entry(view, start, end)
    slices = _once(view, *value, (_VALUES, _INDICES))
    if len(slices) != 2:
        raise _Unexpected("rows without values or indices")
    values = tu.tensor_bytes_to_ndarray(view[slice(*slices[_VALUES])])
    indices = tu.tensor_bytes_to_ndarray(view[slice(*slices[_INDICES])])
    return name, tu.indexed_rows_of(values, indices)


def _decode_native(data: bytes) -> DecodedPush:
    """`_decode_python`'s answer, the fields found by the extension; where it does not read
    the bytes (see push_wire_cpu.h) the Python does."""
    layout = _native.push_decode(data, pb.DT_STRING)
    if layout is None:
        return _decode_python(data)
    request, tables, dense_spans = layout
    view = memoryview(data)
    embedding: Dict[str, tu.IndexedRows] = {}
    for name, v_dtype, v_dims, v_start, v_end, i_dtype, i_dims, i_start, i_end in tables:
        values = tu.tensor_view(view, v_dtype, v_dims, v_start, v_end)
        indices = tu.tensor_view(view, i_dtype, i_dims, i_start, i_end)
        embedding[name] = tu.indexed_rows_of(values, indices)
    dense: Dict[str, np.ndarray] = {}
    for name, dtype, dims, start, end in dense_spans:
        dense[name] = tu.tensor_view(view, dtype, dims, start, end)
    return DecodedPush(pb.PushGradientsRequest.FromString(request), embedding, dense)


def _split_out(view: memoryview, outer: int, take) -> bytes:
    """The message in `view` without the fields of its message field `outer` that
    `take(number, value start, value end)` consumed (True): the rest as it is, the occurrences
    of `outer` merged into one (as a parser merges them), present (maybe empty) when it was."""
    rest: List = []
    kept: List = []
    seen = False
    for number, wire, field_start, start, end in _fields(view, 0, len(view)):
        if number != outer or wire != _LEN:
            rest.append(view[field_start:end])
            continue
        seen = True
        for inner, inner_wire, inner_start, s, e in _fields(view, start, end):
            if inner_wire != _LEN or not take(inner, s, e):
                kept.append(view[inner_start:e])
    if seen:
        body = b"".join(kept)
        rest += [_tag(outer), tu._varint(len(body)), body]
    return b"".join(rest)


def _decode_python(data: bytes) -> DecodedPush:
    view = memoryview(data)
    embedding: Dict[str, tu.IndexedRows] = {}
    dense: Dict[str, np.ndarray] = {}

    def take(number: int, start: int, end: int) -> bool:
        if number == _TABLES:
            name, rows = _table(view, start, end)
            embedding[name] = rows  # a map's later entry wins, as in protobuf
        elif number == _DENSE:
            name, value = _entry(view, start, end)
            dense[name] = tu.tensor_bytes_to_ndarray(view[slice(*value)])
        else:
            return False
        return True

    request = pb.PushGradientsRequest.FromString(_split_out(view, _GRADIENTS, take))
    return DecodedPush(request, embedding, dense)


def decode_push(data: bytes) -> DecodedPush:
    """The request in `data` (bytes, or a channel frame's bytearray), its embedding gradients as
    views of `data` (read-only for bytes) where the bytes are laid out as usual (see the module
    docstring)."""
    try:
        return _decode_native(data) if _native is not None else _decode_python(data)
    except (_Unexpected, ValueError, UnicodeDecodeError):
        return DecodedPush(pb.PushGradientsRequest.FromString(bytes(data)))
