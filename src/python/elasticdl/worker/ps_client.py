"""The worker's view of the parameter servers.

Placement rules (shared with the PS and checkpoints): a dense parameter lives whole on PS
`string_to_id(name, num_ps)`; embedding row `id` lives on PS `id % num_ps`. Every call fans out
to the PS concerned with gRPC futures so all PS work in parallel, and each PS's model version is
tracked separately (each PS has its own version counter).

Message sizes: read-only pulls of embedding rows are cut into messages of at most
`max_message_bytes` (4 MiB default) so no single response stalls the channel. Pushes of a model
or of gradients are *one* message per PS on purpose: the PS applies a gradient message
atomically and bumps its version once per message, so cutting one would change the training
semantics (and its version counting in sync mode).

Pushes go through one `PSLink` per PS (elasticdl.worker.ps_links): on the same host the dense
gradients travel through shared memory and the push over a local channel, with a fallback to
messages per PS; this module fans a push out over the links and assembles the result.
"""
from __future__ import annotations

import itertools
import logging
import secrets
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import grpc
import numpy as np
from elasticdl.common import local_channel as lc
from elasticdl.common import shared_memory as shm
from elasticdl.common.hash_utils import string_to_id
from elasticdl.common.push_wire import PushAnswer, decode_push_answer, packed_layout_digest
from elasticdl.common.tensor_utils import (
    ALIGNMENT,
    IndexedRows,
    aligned_copy,
    ndarray_to_pb,
    pb_to_dtype,
    pb_to_ndarray,
    tensor_bytes_to_ndarray,
)
from elasticdl.common.tls import TLS
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc
from elasticdl.worker import id_shares
from elasticdl.worker.grpc_utils import Backoff, build_channel, is_retryable
from elasticdl.worker.ps_fan_out import fan_out
from elasticdl.worker.ps_links import (  # noqa: F401  (the attach schedule, re-exported)
    ATTACH_MAX_DOUBLINGS,
    ATTACH_RETRY_PUSHES,
    PSLink,
    PushPart,
    dense_to_message,
)
from elasticdl.worker.ps_types import (  # noqa: F401 (part of this module's names)
    DistinctIdRows,
    EmbeddingTableInfo,
    PackedGradients,
    PackedLayout,
    PSUnavailableError,
    PullResult,
    PushResult,
    deduplicate_indexed_rows,
    message_layout,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# The largest answer a pull of embedding rows takes on a local channel (bigger ones, e.g. an
# export's whole table, go by gRPC in messages of `max_message_bytes`).
CHANNEL_PULL_MAX_BYTES = 64 * 1024 * 1024


def _serialize(request) -> bytes:
    """A request message, or a ps_links.PushRequest, as bytes."""
    return request.SerializeToString()


def _count(pos) -> int:
    """How many ids a share of a pull holds: a slice of `unique`, or positions in it."""
    return pos.stop - pos.start if isinstance(pos, slice) else int(pos.size)


class PSClient:
    def __init__(
        self,
        ps_addrs: Sequence[str],
        worker_id: int = 0,
        retry_timeout: float = 60.0,
        rpc_timeout: float = 120.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        shared_memory: Optional[bool] = None,
        secret: Optional[str] = None,
        tls_config: Optional[TLS] = None,
        stream_channel: Optional[bool] = None,
    ):
        if not ps_addrs:
            raise ValueError(
                "--ps_addrs is empty: the ParameterServerStrategy needs at least one PS"
            )
        self.addrs = list(ps_addrs)
        self.num_ps = len(self.addrs)
        self.worker_id = int(worker_id)
        # Push numbers (`PushGradientsRequest.push_id`) start at random: another client with
        # the same worker id (a relaunched worker) never repeats one the PS has taken.
        self._push_ids = itertools.count(secrets.randbits(62) + 1)
        self.retry_timeout = retry_timeout
        self.rpc_timeout = rpc_timeout
        self.max_message_bytes = int(max_message_bytes)
        self._channels = [build_channel(a, secret, tls_config) for a in self.addrs]
        self._stubs = [pb_grpc.PserverStub(c) for c in self._channels]
        for stub, channel in zip(self._stubs, self._channels):
            # Rows come back as a view of the received bytes, not through a parsed message
            # (the PS writes them with one copy: elasticdl.ps.servicer.wire_handlers).
            stub.pull_embedding_vectors = channel.unary_unary(
                "/elasticdl.Pserver/pull_embedding_vectors",
                request_serializer=pb.PullEmbeddingVectorsRequest.SerializeToString,
                response_deserializer=tensor_bytes_to_ndarray,
            )
            # A push is sent as a ps_links.PushRequest, whose embedding rows go into the
            # request's bytes without protobuf's copies, and its answer's parameters are read as
            # views of the received bytes (elasticdl.common.push_wire).
            stub.push_gradients = channel.unary_unary(
                "/elasticdl.Pserver/push_gradients",
                request_serializer=_serialize,
                response_deserializer=decode_push_answer,
            )
        self._links = [
            PSLink(i, addr, stub, self.worker_id, rpc_timeout)
            for i, (addr, stub) in enumerate(zip(self.addrs, self._stubs))
        ]
        self.ps_versions: List[int] = [-1] * self.num_ps  # -1: never pulled
        self._table_dims: Dict[str, int] = {}
        # Same-host fast path for dense tensors (elasticdl.common.shared_memory): on unless
        # ELASTICDL_SHARED_MEMORY=0 or the host has no /dev/shm; used with each PS that can map
        # this worker's region, the others get messages.
        if shared_memory is None:
            shared_memory = shm.enabled() and shm.default_directory() is not None
        self.shared_memory = bool(shared_memory)
        # With a PS this worker shares no memory with (another host): pushes and pulls on the
        # PS's stream channel (elasticdl.common.local_channel) unless ELASTICDL_STREAM_CHANNEL=0
        # or the job has TLS certificates (the stream is not encrypted; the PS offers none).
        if stream_channel is None:
            stream_channel = lc.stream_enabled() and tls_config is None
        self.stream_channel = bool(stream_channel)
        self._dense_layout: Optional[Dict[str, Tuple[np.dtype, Tuple[int, ...]]]] = None
        # Per PS, the tensors of the dense layout it holds: what a region with it is made for.
        self._dense_layout_of: List[Dict[str, Tuple[np.dtype, Tuple[int, ...]]]] = []
        self._message_layout: Optional[PackedLayout] = None
        # Per PS, the digest of its tensors' layout that asks it for packed answers (b"": none).
        self._packed_digests: List[bytes] = []

    def close(self) -> None:
        for link in self._links:
            link.close()
        for c in self._channels:
            c.close()

    def drop(self) -> None:
        """Close without calling the PS: the job's PS set changed, and a PS now at one of these
        addresses knows nothing of this client's regions (the old PS unmapped them as they
        stopped)."""
        for link in self._links:
            shared, link.shared = link.shared, None
            if shared is not None:
                shared.close()
            link.drop_stream()
        for c in self._channels:
            c.close()

    # ------------------------------------------------------------------ shared memory
    def set_dense_layout(self, params: Mapping[str, np.ndarray]) -> None:
        """The dense model's tensors (name -> array-like with dtype and shape): pushes then try
        the shared-memory path with each PS that holds some of them."""
        arrays = {name: np.asarray(v) for name, v in params.items()}
        self._dense_layout = {name: (a.dtype, a.shape) for name, a in arrays.items()}
        self._dense_layout_of = [dict() for _ in range(self.num_ps)]
        for name, spec in self._dense_layout.items():
            self._dense_layout_of[self.ps_of_param(name)][name] = spec
        self._message_layout = message_layout(self._dense_layout_of)
        self._packed_digests = [
            packed_layout_digest(specs) if specs and self._message_layout is not None else b""
            for specs in self._dense_layout_of
        ]
        for link in self._links:
            link.attach_countdown = 0

    def packed_layout(self) -> Optional[PackedLayout]:
        """The layout of the flat blocks in which the trainer's packed step takes every dense
        parameter and gives every gradient: that of the packed shared-memory regions when every
        dense tensor goes through one (one copy per PS each way), the worker's own when none
        does (the blocks' tensors then travel in messages); None otherwise."""
        if self._dense_layout is None:
            return None
        if all(link.shared is None for link in self._links):
            return self._message_layout
        entries, covered = [], 0
        for link in self._links:
            if link.shared is None:
                continue
            packed = link.shared.region.packed()
            if packed is None:
                return None
            entries.append((link.ps_id, packed.entries))
            covered += len(packed.entries)
        if covered != len(self._dense_layout):
            return None
        return PackedLayout(tuple(entries))

    def shared_memory_ps(self) -> List[int]:
        """The PS this worker currently exchanges dense tensors with through shared memory."""
        return [link.ps_id for link in self._links if link.shared is not None]

    def _maybe_attach(self, link: PSLink) -> None:
        """Let `link` attach a region when due, unless the fast path is off or has no layout."""
        if not self.shared_memory or self._dense_layout is None:
            return
        try:
            link.maybe_attach(self._dense_layout_of[link.ps_id])
        except shm.SharedMemoryError as e:
            logger.info("shared memory unavailable (%s): dense tensors travel in messages", e)
            self.shared_memory = False

    # ------------------------------------------------------------------ fan-out with retries
    def _fan_out(
        self,
        method: str,
        requests: Sequence[Tuple[int, object]],
        reissue: Optional[Callable[[int, object, grpc.RpcError], Optional[object]]] = None,
    ) -> List[object]:
        return fan_out(
            self._stubs,
            self.addrs,
            method,
            requests,
            retry_timeout=self.retry_timeout,
            rpc_timeout=self.rpc_timeout,
            reissue=reissue,
        )

    # ------------------------------------------------------------------ placement
    def ps_of_param(self, name: str) -> int:
        return string_to_id(name, self.num_ps)

    def partition_dense(self, params: Mapping[str, np.ndarray]) -> List[Dict[str, np.ndarray]]:
        parts: List[Dict[str, np.ndarray]] = [dict() for _ in range(self.num_ps)]
        for name, value in params.items():
            parts[self.ps_of_param(name)][name] = value
        return parts

    # ------------------------------------------------------------------ model init
    def push_model(
        self,
        dense_params: Mapping[str, np.ndarray],
        embedding_infos: Sequence[EmbeddingTableInfo] = (),
        version: int = 0,
        state: Optional[Mapping[str, np.ndarray]] = None,
    ) -> None:
        """Offer the initial model (`state`: its non-trainable variables, placed like dense
        parameters); a PS that is already initialised keeps its own values."""
        parts = self.partition_dense(dense_params)
        state_parts = self.partition_dense(state or {})
        reqs = []
        for ps_id in range(self.num_ps):
            model = pb.Model(version=version)
            for name, value in parts[ps_id].items():
                ndarray_to_pb(np.asarray(value), model.dense_parameters[name])
            for name, value in state_parts[ps_id].items():
                ndarray_to_pb(np.asarray(value), model.state[name])
            self._add_infos(model, embedding_infos)
            reqs.append((ps_id, model))
        self._fan_out("push_model", reqs)

    def push_state(self, state: Mapping[str, np.ndarray]) -> bool:
        """Send the model's non-trainable state alone, each PS its share (PS holding none are
        not called); nothing is applied and no version changes. False when a PS holds no
        model (relaunched): its share is not taken. A PS that predates the call raises
        UNIMPLEMENTED."""
        reqs = []
        for ps_id, share in enumerate(self.partition_dense(state)):
            if share:
                model = pb.Model()
                for name, value in share.items():
                    ndarray_to_pb(np.asarray(value), model.state[name])
                reqs.append((ps_id, model))
        return all(r.accepted for r in self._fan_out("push_state", reqs))

    def push_embedding_table_infos(self, infos: Sequence[EmbeddingTableInfo]) -> None:
        if not infos:
            return
        reqs = []
        for ps_id in range(self.num_ps):
            model = pb.Model()
            self._add_infos(model, infos)
            reqs.append((ps_id, model))
        self._fan_out("push_embedding_table_infos", reqs)

    def _add_infos(self, model: pb.Model, infos: Sequence[EmbeddingTableInfo]) -> None:
        from elasticdl.common.tensor_utils import dtype_to_pb

        for info in infos:
            self._table_dims[info.name] = int(info.dim)
            model.embedding_table_infos.add(
                name=info.name,
                dim=int(info.dim),
                initializer=info.initializer,
                dtype=dtype_to_pb(info.dtype),
                vocabulary=int(info.vocabulary or 0),
            )

    # ------------------------------------------------------------------ pulls
    def pull_dense_parameters(self, force: bool = False, include_state: bool = False) -> PullResult:
        """Parameters newer than what this worker last pulled from each PS.

        `force=True` asks for everything (the local copy is unknown, e.g. after a restart);
        `include_state=True` also for the model's non-trainable state (`PullResult.state`).
        """
        reqs = [
            (
                ps_id,
                pb.PullDenseParametersRequest(
                    version=-1 if force else self.ps_versions[ps_id], include_state=include_state
                ),
            )
            for ps_id in range(self.num_ps)
        ]
        return self._pull_result(self._fan_out("pull_dense_parameters", reqs), include_state)

    def _pull_result(
        self,
        responses: List[pb.PullDenseParametersResponse],
        include_state: bool = False,
        pulled: Optional[List[Optional[Dict[str, np.ndarray]]]] = None,
        packed: Optional[List[Optional[memoryview]]] = None,
    ) -> PullResult:
        """Parameters and per-PS versions from one PullDenseParametersResponse per PS;
        `pulled[i]`, when not None, holds PS i's parameters read apart from its message, and
        `packed[i]` the bytes of PS i's parameters when they came as one block."""
        responses = list(responses)
        pulled = list(pulled) if pulled is not None else [None] * len(responses)
        packed = list(packed) if packed is not None else [None] * len(responses)
        # A PS whose version went back was relaunched from an older checkpoint: it sends nothing
        # for a request of a newer version, but the local copy is not its model any more.
        went_back = [
            (i, pb.PullDenseParametersRequest(version=-1, include_state=include_state))
            for i, resp in enumerate(responses)
            if resp.initialized and 0 <= resp.version < self.ps_versions[i]
        ]
        if went_back:
            logger.warning(
                "PS %s went back to an older model version (relaunched from a "
                "checkpoint): pulling all its parameters",
                [i for i, _ in went_back],
            )
            for (i, _), resp in zip(went_back, self._fan_out("pull_dense_parameters", went_back)):
                responses[i], pulled[i], packed[i] = resp, None, None
        uninitialized = []
        params: Dict[str, np.ndarray] = {}
        state: Dict[str, np.ndarray] = {}
        blocks: Optional[Dict[int, np.ndarray]] = {}
        in_regions = False
        for ps_id, resp in enumerate(responses):
            if not resp.initialized:
                uninitialized.append(ps_id)
                self.ps_versions[ps_id] = -1
                continue
            if resp.parameters_in_shared_memory:
                shared = self._links[ps_id].shared
                if shared is None:  # cannot happen: only a push naming a region gets this answer
                    raise RuntimeError(f"PS {ps_id} answered in shared memory this worker lacks")
                params.update(shared.region.parameters())
                in_region = shared.region.packed()
                in_regions = True
                if blocks is not None and in_region is not None:
                    blocks[ps_id] = in_region.parameters
                else:
                    blocks = None
            elif packed[ps_id] is not None:
                block = self._packed_block(ps_id, resp, packed[ps_id])
                params.update(self._message_layout.unpack(ps_id, block))
                if blocks is not None:
                    blocks[ps_id] = block
            elif resp.dense_parameters or pulled[ps_id]:
                blocks = None
            if pulled[ps_id]:
                params.update(pulled[ps_id])
            for name, tensor in resp.dense_parameters.items():
                params[name] = pb_to_ndarray(tensor)
            for name, tensor in resp.state.items():
                state[name] = pb_to_ndarray(tensor)
            self.ps_versions[ps_id] = resp.version
        return PullResult(
            uninitialized_ps=uninitialized,
            parameters=params,
            blocks=blocks or None,
            state=state,
            blocks_are_views=in_regions,
        )

    def _packed_block(self, ps_id: int, resp: pb.PullDenseParametersResponse, data) -> np.ndarray:
        """PS `ps_id`'s parameters that came as one block (`data`, its bytes), as the packed
        step takes them: `data` itself when it starts at a 64-byte boundary (an answer read from
        a channel), else an aligned copy."""
        layout = self._message_layout
        entries = layout.entries_of(ps_id) if layout is not None else ()
        expected = tuple(name for name, *_ in entries)
        dtype = pb_to_dtype(resp.packed_dtype)
        names = tuple(resp.packed_names)
        size = entries[-1][1] + entries[-1][2] if entries else 0
        mine = {spec[0] for spec in self._dense_layout_of[ps_id].values()} if entries else set()
        if names != expected or mine != {dtype} or data.nbytes != size * dtype.itemsize:
            raise RuntimeError(
                f"PS {ps_id} sent its dense parameters as one block of {len(names)} {dtype} "
                f"tensors ({data.nbytes} bytes, {list(names[:3])}...) that this worker's model "
                f"does not hold as {len(expected)} tensors ({list(expected[:3])}...): the PS and "
                "the worker run different models"
            )
        block = np.frombuffer(data, dtype)
        return block if block.ctypes.data % ALIGNMENT == 0 else aligned_copy(block)

    def rows_per_message(self, name: str, dim: Optional[int] = None) -> int:
        dim = dim or self._table_dims.get(name) or 1
        return max(1, self.max_message_bytes // (4 * int(dim)))

    def pull_embedding_vectors(
        self, name: str, ids, dim: Optional[int] = None, ids_unique: bool = False
    ) -> np.ndarray:
        """Rows `ids` (any order, duplicates allowed) of table `name`, shape (len(ids), dim).

        Ids are de-duplicated before they travel (`ids_unique=True`: the caller's are already,
        e.g. from tf.unique, so no sort is spent on it); each PS gets its own ids in messages
        whose responses stay under the message budget, all in flight at once. The result may
        be a read-only view of the received bytes: copy it to write to it.
        """
        return self.pull_rows_of_tables([(name, dim)], ids, ids_unique)[0]

    def pull_rows_of_tables(
        self, tables: Sequence[Tuple[str, Optional[int]]], ids, ids_unique: bool = False
    ) -> List[np.ndarray]:
        """Rows `ids` of every table of `tables` ((name, dim) pairs), as `pull_embedding_vectors`
        gives them for each: several Embedding layers that look up the same ids (a DeepFM's
        vectors and first-order weights) get their rows in one round trip per PS on a local
        channel, and in one fan-out of gRPC calls otherwise."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        dims = [int(dim or self._table_dims.get(name) or 0) for name, dim in tables]
        if ids.size == 0:
            return [np.zeros((0, d), dtype=np.float32) for d in dims]
        if ids.min() < 0:
            name = tables[0][0]
            raise ValueError(f"embedding {name}: ids must be non-negative, got {int(ids.min())}")
        if ids_unique:
            unique, inverse = ids, None
        else:
            unique, inverse = np.unique(ids, return_inverse=True)
        # Per PS: its ids' positions in `unique` (a slice when there is one PS: no copy).
        if self.num_ps == 1:
            shares = [(0, slice(0, unique.size))]
        else:
            masks = id_shares.owner_masks(unique, self.num_ps)
            shares = [(ps_id, np.flatnonzero(mask)) for ps_id, mask in enumerate(masks)]
        # The local channels first (one frame per PS and table: the channel has no per-message
        # budget), then the gRPC calls run while those PS work, then the channels' answers are
        # read. `by_grpc`: (table, ps_id, positions).
        on_channel, by_grpc = [], []
        for ps_id, pos in shares:
            count = _count(pos)
            if count == 0:
                continue
            fits = [
                t
                for t in range(len(tables))
                if count * 4 * max(dims[t], 1) <= CHANNEL_PULL_MAX_BYTES
            ]
            requests = []
            if fits and self._links[ps_id].may_pull_on_channel():
                share_ids = ndarray_to_pb(unique[pos])
                for t in fits:
                    req = pb.PullEmbeddingVectorsRequest(name=tables[t][0])
                    req.ids.CopyFrom(share_ids)
                    requests.append(req)
            if requests and self._links[ps_id].send_pulls(requests):
                on_channel.append((ps_id, pos, fits))
            else:
                fits = []
            by_grpc += [(t, ps_id, pos) for t in range(len(tables)) if t not in fits]
        slots: List[list] = [[] for _ in tables]  # per table: positions, rows
        again = []
        try:
            self._pull_by_grpc(tables, dims, unique, by_grpc, slots)
        finally:
            # Every channel's answers are read, even after a gRPC error: an unread one would be
            # taken for the next call's.
            for ps_id, pos, fits in on_channel:
                for t, rows in zip(fits, self._links[ps_id].receive_pulls()):
                    if rows is None:
                        again.append((t, ps_id, pos))
                    else:
                        slots[t].append((pos, rows))
        if again:
            self._pull_by_grpc(tables, dims, unique, again, slots)
        return [
            self._assemble(name, unique, inverse, table_slots)
            for (name, _), table_slots in zip(tables, slots)
        ]

    @staticmethod
    def _assemble(name: str, unique: np.ndarray, inverse, slots) -> np.ndarray:
        """One table's rows for `unique` from its (positions, rows) answers, then for the
        caller's ids (`inverse`, None when they were `unique`)."""
        for pos, rows in slots:
            expected = _count(pos)
            if rows.ndim != 2 or rows.shape[0] != expected:
                raise RuntimeError(
                    f"embedding {name}: PS returned {rows.shape[0] if rows.ndim else 0} rows "
                    f"for {expected} ids"
                )
        if len(slots) == 1:
            out = slots[0][1]
        else:
            first = slots[0][1]
            out = np.empty((unique.size,) + first.shape[1:], dtype=first.dtype)
            for pos, rows in slots:
                id_shares.put_rows(out, pos, rows)
        return out if inverse is None else out[inverse]

    def _pull_by_grpc(self, tables, dims, unique: np.ndarray, shares, slots) -> None:
        """Pull table `t`'s rows of `unique[pos]` from PS `ps_id` for every (t, ps_id, pos) of
        `shares`, in messages of at most `rows_per_message` rows, all in flight at once; each
        answer goes to `slots[t]` as (positions, rows)."""
        reqs, targets = [], []
        for t, ps_id, pos in shares:
            name = tables[t][0]
            chunk = self.rows_per_message(name, dims[t] or None)
            count = _count(pos)
            for s in range(0, count, chunk):
                if isinstance(pos, slice):
                    part = slice(pos.start + s, min(pos.start + s + chunk, pos.stop))
                else:
                    part = pos[s : s + chunk]
                req = pb.PullEmbeddingVectorsRequest(name=name)
                ndarray_to_pb(unique[part], req.ids)
                reqs.append((ps_id, req))
                targets.append((t, part))
        if not reqs:
            return
        for (t, part), rows in zip(targets, self._fan_out("pull_embedding_vectors", reqs)):
            slots[t].append((part, rows))

    def pull_embedding_table(self, name: str) -> IndexedRows:
        """Every row the PS hold for table `name` (used to export a self-contained model)."""
        from elasticdl.common.tensor_utils import pb_to_indexed_rows

        values, indices = [], []
        rows_per_msg = self.rows_per_message(name)
        for ps_id, stub in enumerate(self._stubs):
            req = pb.PullEmbeddingTableRequest(name=name, max_rows_per_message=rows_per_msg)
            backoff = Backoff(self.retry_timeout)
            while True:
                try:
                    part_v, part_i = [], []
                    for msg in stub.pull_embedding_table(req, timeout=self.rpc_timeout):
                        rows = pb_to_indexed_rows(msg)
                        part_v.append(rows.values)
                        part_i.append(rows.indices)
                    values.extend(part_v)
                    indices.extend(part_i)
                    break
                except grpc.RpcError as err:
                    if not is_retryable(err) or not backoff.sleep_or_give_up():
                        raise
        if not indices:
            dim = self._table_dims.get(name, 0)
            return IndexedRows(np.zeros((0, dim), np.float32), np.zeros((0,), np.int64))
        return IndexedRows(np.concatenate(values), np.concatenate(indices))

    # ------------------------------------------------------------------ pushes
    def push_gradients(
        self,
        dense_grads: Mapping[str, np.ndarray],
        embedding_grads: Mapping[str, Tuple[np.ndarray, np.ndarray]] = None,
        learning_rate: float = 0.0,
        pull_dense: bool = False,
        state: Optional[Mapping[str, np.ndarray]] = None,
    ) -> PushResult:
        """Send gradients to every PS (an empty message still counts, so all PS versions advance
        together); embedding gradients are summed per id (unless they are `DistinctIdRows`)
        and scattered by `id % num_ps`.

        Each message carries the version this worker computed against on that PS, which the PS
        uses for staleness checks (sync) or lr modulation (async). `pull_dense=True` asks each
        PS to answer with its parameters newer than that version as well (`PushResult.pulled`),
        saving the separate pull of the next step. `state`: the model's non-trainable variables,
        which each PS assigns (its own share) when it accepts the push.
        """
        parts = self._push_parts(dense_grads, embedding_grads, learning_rate, pull_dense)
        if state:
            for ps_id, share in enumerate(self.partition_dense(state)):
                for name, value in share.items():
                    ndarray_to_pb(np.asarray(value), parts[ps_id].request.gradients.state[name])
        for link, part in zip(self._links, parts):
            self._maybe_attach(link)
            if self.stream_channel:
                link.maybe_open_stream()
            link.prepare_push(part)
        answers = self._send_pushes()
        responses = [a.message for a in answers]
        pulled = None
        if pull_dense and all(r.HasField("dense_parameters") for r in responses):
            pulled = self._pull_result(
                [r.dense_parameters for r in responses],
                pulled=[a.pulled for a in answers],
                packed=[a.packed for a in answers],
            )
        return PushResult(
            accepted=all(r.accepted for r in responses),
            versions={ps_id: r.version for ps_id, r in enumerate(responses)},
            pulled=pulled,
        )

    def _push_parts(
        self,
        dense_grads: Mapping[str, np.ndarray],
        embedding_grads: Optional[Mapping[str, Tuple[np.ndarray, np.ndarray]]],
        learning_rate: float,
        pull_dense: bool,
    ) -> List[PushPart]:
        """Every PS's share of a push: its request (all but the dense gradients) and its dense
        gradients, which its link routes."""
        packed = dense_grads if isinstance(dense_grads, PackedGradients) else None
        if packed is None:
            by_name = self.partition_dense(dense_grads)
        parts = []
        push_id = next(self._push_ids)  # every resend of this push carries it too
        packed_pull = pull_dense and bool(self._packed_digests)
        for ps_id, version in enumerate(self.ps_versions):
            req = pb.PushGradientsRequest(
                gradients=pb.Model(version=max(version, 0)),
                learning_rate=float(learning_rate),
                worker_id=self.worker_id,
                pull_dense_parameters=pull_dense,
                # The parameters as one block, which the packed step takes as it is.
                pull_dense_packed=self._packed_digests[ps_id] if packed_pull else b"",
                push_id=push_id,
            )
            if packed is None:
                parts.append(PushPart(req, dense=by_name[ps_id]))
            elif ps_id in packed.blocks:
                block = packed.blocks[ps_id]
                parts.append(PushPart(req, block=block, entries=packed.layout.entries_of(ps_id)))
            else:
                parts.append(PushPart(req, dense={}))
        for name, grad in (embedding_grads or {}).items():
            if isinstance(grad, DistinctIdRows):
                values, ids = grad
            else:
                values, ids = deduplicate_indexed_rows(*grad)
            if self.num_ps == 1:  # no split, so no copy of the rows through a mask
                parts[0].embedding[name] = IndexedRows(values, ids)
                continue
            for ps_id, share in enumerate(id_shares.split_rows(values, ids, self.num_ps)):
                if share is not None:
                    parts[ps_id].embedding[name] = IndexedRows(*share)
        return parts

    def _send_pushes(self) -> List[PushAnswer]:
        """Send every link's prepared push and collect the answers, in PS order.

        Pushes on a local channel are sent first, the gRPC ones run meanwhile, then the channel
        answers are read: every PS works on its push at the same time. A push whose region or
        channel failed is sent once more, in a message, to that PS alone (the link decides).
        """
        responses: List[Optional[PushAnswer]] = [None] * self.num_ps
        try:
            on_channel = [link for link in self._links if link.on_channel]
            for link in on_channel:
                link.send()
            by_grpc = [link for link in self._links if not link.on_channel]
            if by_grpc:
                answers = self._fan_out(
                    "push_gradients",
                    [(link.ps_id, link.in_flight()) for link in by_grpc],
                    reissue=self._reissue_push,
                )
                for link, resp in zip(by_grpc, answers):
                    responses[link.ps_id] = resp
            again = [link for link in on_channel if not link.sent]
            for link in on_channel:
                if link.sent:
                    resp = link.receive()
                    if resp is None:
                        again.append(link)
                    responses[link.ps_id] = resp
            if again:
                requests = [(link.ps_id, link.in_message()) for link in again]
                for link, resp in zip(again, self._fan_out("push_gradients", requests)):
                    responses[link.ps_id] = resp
        finally:
            for link in self._links:
                link.end_push()
        return responses

    def _reissue_push(self, ps_id: int, req, err: grpc.RpcError):
        return self._links[ps_id].reissue(req, err)

    def save_checkpoint(self, checkpoint_dir: str = "") -> List[pb.SaveCheckpointResponse]:
        reqs = [
            (ps_id, pb.SaveCheckpointRequest(checkpoint_dir=checkpoint_dir))
            for ps_id in range(self.num_ps)
        ]
        return self._fan_out("save_checkpoint", reqs)


def wait_for_ps(client: PSClient, timeout: float) -> None:
    """Block until every PS channel is connected (or raise after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    for addr, channel in zip(client.addrs, client._channels):
        try:
            grpc.channel_ready_future(channel).result(timeout=max(0.1, deadline - time.monotonic()))
        except grpc.FutureTimeoutError:
            raise PSUnavailableError(f"PS {addr} not reachable after {timeout:.0f}s") from None
