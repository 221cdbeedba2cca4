"""Gradient application policy of one PS: asynchronous or synchronous SGD, and the model version.

Non-trainable state a push carries (parameters.py) is assigned when the push is accepted. State
sent alone (`push_state`, a training task cut short) is assigned whatever the policy: it is no
gradient, so it neither waits for staleness nor counts as an update, and the version stays.

Async: every accepted push is applied at once and bumps the version; with staleness modulation
its learning rate is divided by max(1, ps_version - grad_version).

Sync (`grads_to_wait` = K): a push is accepted if grad_version >= ps_version - tolerance, then
buffered; after K accepted pushes the dense gradients are AVERAGED, the sparse ones SUMMED (the
rows each worker touched are disjoint samples of the batch), applied once, and the version bumps.

A push its worker numbered (`push_id`) is taken once: sent again because its answer was lost (a
connection that broke after the PS took it, a local channel that failed), it is answered as it
was, without its gradients applied or buffered a second time. The PS remembers each worker's last
numbered push; the worker resends only the push in flight.

One lock covers apply and every read of the model, so readers never see a half-applied update;
it is metered (elasticdl.ps.load_meter: how long requests queue for it and hold it).
NumPy and the native kernels release the GIL for large arrays, so decoding a push (done before
taking the lock) overlaps with another push being applied.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
from elasticdl import ops
from elasticdl.common.push_wire import DensePull
from elasticdl.common.shared_memory import SharedMemoryError, SharedRegion
from elasticdl.common.tensor_utils import IndexedRows
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.ps.errors import PSError
from elasticdl.ps.load_meter import MeteredLock
from elasticdl.ps.optimizer import Optimizer
from elasticdl.ps.parameters import Parameters

logger = logging.getLogger(__name__)


@dataclass
class UpdatePolicy:
    use_async: bool = False
    grads_to_wait: int = 1
    lr_staleness_modulation: bool = False
    sync_version_tolerance: int = 0

    def __post_init__(self):
        if self.grads_to_wait < 1:
            raise PSError(f"--grads_to_wait must be >= 1, got {self.grads_to_wait}")
        if self.sync_version_tolerance < 0:
            raise PSError(
                f"--sync_version_tolerance must be >= 0, got {self.sync_version_tolerance}"
            )
        if self.use_async and self.grads_to_wait != 1:
            logger.info(
                "async mode applies every push: grads_to_wait=%d ignored", self.grads_to_wait
            )
            self.grads_to_wait = 1


@dataclass
class PushResult:
    accepted: bool
    version: int


class _SyncBuffer:
    """Gradients accepted since the last synchronous apply."""

    def __init__(self):
        self.count = 0
        self.learning_rate = 0.0
        self.dense: dict[str, np.ndarray] = {}
        self.sparse: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}

    def add(self, dense: dict, sparse: dict, learning_rate: float) -> None:
        for name, grad in dense.items():
            acc = self.dense.get(name)
            if acc is None:
                self.dense[name] = np.array(grad, dtype=np.float32, copy=True)
            else:
                ops.dense_accumulate(acc, grad)
        for name, pair in sparse.items():
            self.sparse.setdefault(name, []).append(pair)
        if learning_rate > 0:
            self.learning_rate = learning_rate
        self.count += 1


# Far above any learning rate that trains: a push asking for more is a bug or an attack.
MAX_LEARNING_RATE = 1e3


def _check_push(dense: dict, sparse: dict, learning_rate: float) -> float | None:
    """The push's learning rate (None: the optimizer's own), after refusing what would wreck
    the model: a learning rate that is negative, not finite or absurd, or gradients holding
    NaN or infinity (one diverged worker must not poison every replica's model)."""
    lr = float(learning_rate)
    if lr != 0.0 and not 0.0 < lr <= MAX_LEARNING_RATE:
        raise PSError(
            f"learning rate {lr:g} refused: a push may ask for one in (0, {MAX_LEARNING_RATE:g}]"
        )
    for name, grad in dense.items():
        # A sum is NaN or infinite when any element is, at the cost of one read.
        if not np.isfinite(np.add.reduce(grad, axis=None)):
            raise PSError(f"gradient for dense parameter {name!r} holds NaN or infinity")
    for name, (_, values) in sparse.items():
        if values.size and not np.isfinite(np.add.reduce(values, axis=None)):
            raise PSError(f"gradient for embedding table {name!r} holds NaN or infinity")
    return lr if lr > 0 else None


class ParameterServer:
    """The model of one PS plus the policy that updates it; transport-agnostic."""

    def __init__(
        self,
        params: Parameters,
        optimizer: Optimizer,
        policy: UpdatePolicy | None = None,
        on_version: Callable[[int], None] | None = None,
        on_state: Callable[[int], None] | None = None,
    ):
        self.params = params
        self.optimizer = optimizer
        self.policy = policy or UpdatePolicy()
        self.lock = MeteredLock()
        self._buffer = _SyncBuffer()
        # Called (under the lock, so versions arrive in order) after every version bump; must
        # return quickly -- the servicer hands slow work (RPCs, file writes) to threads.
        self._on_version = on_version
        # Called likewise, with the unchanged version, after state sent alone was assigned.
        self._on_state = on_state
        # worker_id -> (push_id, accepted) of the last numbered push taken from that worker: a
        # resend of it (its answer was lost) is answered, not taken twice.
        self._last_push: dict[int, tuple[int, bool]] = {}

    @property
    def version(self) -> int:
        return self.params.version

    # ------------------------------------------------------------------ model set-up
    def push_model(self, model: pb.Model) -> bool:
        with self.lock:
            taken = self.params.init_from_model_pb(model)
        if taken:
            logger.info(
                "PS %d initialised at version %d: %d dense parameters, %d embedding tables",
                self.params.ps_id,
                self.params.version,
                len(self.params.dense),
                len(self.params.embedding_tables),
            )
        return taken

    def push_embedding_table_infos(self, model: pb.Model) -> None:
        with self.lock:
            self.params.set_embedding_table_infos(model.embedding_table_infos)

    def push_state(self, model: pb.Model) -> PushResult:
        """Assign the state `model` carries (nothing else is read); not accepted, and nothing
        assigned, while the PS holds no model: the worker's next pull offers its model, state
        included, again. A bad variable refuses the whole push (PSError), nothing assigned."""
        with self.lock:
            p = self.params
            if not p.initialized:
                return PushResult(False, p.version)
            state = p.check_state(model.state)
            p.state.update(state)
            if state and self._on_state is not None:
                self._on_state(p.version)
            return PushResult(True, p.version)

    def restore(self, model: pb.Model) -> None:
        with self.lock:
            self.params.restore_from_model_pb(model)
            self._buffer = _SyncBuffer()
            self._last_push.clear()

    # ------------------------------------------------------------------ reads
    def pull_dense(
        self, request_version: int, include_state: bool = False
    ) -> pb.PullDenseParametersResponse:
        """The parameters newer than `request_version`; with `include_state`, also every state
        variable (whatever the version: a worker asks for them only when it starts)."""
        resp = pb.PullDenseParametersResponse()
        with self.lock:
            self._fill_pull(resp, request_version)
            if include_state and self.params.initialized:
                self.params.state_to_pb(resp)
        return resp

    def _fill_pull(
        self,
        resp: pb.PullDenseParametersResponse | DensePull,
        request_version: int,
        region: SharedRegion | None = None,
    ) -> None:
        """The parameters newer than `request_version` (all when it is < 0); under the lock.
        With `region`, they are written to its parameter slots instead of the message; into a
        `DensePull`, as serialized bytes (one copy)."""
        p = self.params
        message = resp.message if isinstance(resp, DensePull) else resp
        message.initialized = p.initialized
        message.version = p.version
        if p.initialized and (request_version < 0 or p.version > request_version):
            if region is not None:
                region.write_parameters(p.dense)
                message.parameters_in_shared_memory = True
            elif isinstance(resp, DensePull):
                resp.write(p.dense)  # copies the bytes while we hold the lock
            else:
                p.dense_to_pb(resp)  # serialisation copies the bytes while we hold the lock

    def check_shared_slots(self, slots) -> None:
        """A region must hold exactly this PS's dense parameters, as float32 of their shapes:
        the PS reads a gradient and writes a parameter for each slot."""
        with self.lock:
            p = self.params
            if not p.initialized:
                raise SharedMemoryError("the PS holds no model yet: attach after pushing it")
            names, held = {s.name for s in slots}, set(p.dense)
            if names != held:
                extra, absent = sorted(names - held), sorted(held - names)
                raise SharedMemoryError(
                    f"slots do not match the PS's dense parameters (unknown: {extra[:3]}, "
                    f"absent: {absent[:3]})"
                )
            for s in slots:
                param = p.dense[s.name]
                if s.dtype != param.dtype or s.shape != param.shape:
                    raise SharedMemoryError(
                        f"slot {s.name!r} is {s.dtype}{list(s.shape)}, the parameter is "
                        f"{param.dtype}{list(param.shape)}"
                    )

    def pull_embedding_vectors(self, name: str, ids) -> np.ndarray:
        with self.lock:
            ids = self.params.check_embedding_ids(name, ids)
            return self.params.embedding_tables[name].get(ids, checked=True)

    def snapshot(self, include_slots: bool = True) -> pb.Model:
        with self.lock:
            return self.params.to_model_pb(include_slots)

    def embedding_table_snapshot(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        with self.lock:
            return self.params.get_embedding_table(name).export()

    # ------------------------------------------------------------------ gradients
    def push_gradients(
        self,
        request: pb.PushGradientsRequest,
        pull_into: pb.PullDenseParametersResponse | DensePull | None = None,
        region: SharedRegion | None = None,
        embedding: Mapping[str, IndexedRows] | None = None,
        dense: Mapping[str, np.ndarray] | None = None,
    ) -> PushResult:
        """Handle one push; with `pull_into`, also fill it as `pull_dense(gradients.version)`
        would right after the push, under the same lock (no other update in between).

        With `region` (the one the request names), the dense gradients are read from its
        gradient slots and the pulled parameters written to its parameter slots. `embedding` and
        `dense`: the gradients when the transport read them apart from `request`."""
        grad_version = int(request.gradients.version)
        push_id, worker = int(request.push_id), int(request.worker_id)
        with self.lock:
            taken = self._last_push.get(worker) if push_id else None
            if taken is not None and taken[0] == push_id:
                logger.info(
                    "PS %d: push %d of worker %d came again (its answer was lost): not taken twice",
                    self.params.ps_id,
                    push_id,
                    worker,
                )
                result = PushResult(taken[1], self.params.version)
            else:
                result = self._push_locked(request, grad_version, region, embedding, dense)
                if push_id:
                    self._last_push[worker] = (push_id, result.accepted)
            if pull_into is not None:
                self._fill_pull(pull_into, grad_version, region)
            return result

    def _push_locked(
        self,
        request: pb.PushGradientsRequest,
        grad_version: int,
        region: SharedRegion | None,
        embedding: Mapping[str, IndexedRows] | None,
        dense_grads: Mapping[str, np.ndarray] | None,
    ) -> PushResult:
        p = self.params
        if not p.initialized:
            # A relaunched PS without a checkpoint: the worker sees the rejection, pulls,
            # finds initialized=false and pushes its model again.
            logger.warning("PS %d rejects gradients: model not initialised", p.ps_id)
            return PushResult(False, p.version)
        dense, sparse = p.check_grad(request.gradients, embedding, dense_grads)
        if region is not None:
            if dense:
                raise PSError(
                    "a push names a shared-memory region and also carries dense gradients: "
                    "send them one way only"
                )
            missing = set(request.shared_memory_missing)
            # Views of the slots: the async apply reads them in place, the sync buffer copies.
            dense = {name: region.gradient(name) for name in region.slots if name not in missing}
        state = p.check_state(request.gradients.state)
        lr = _check_push(dense, sparse, request.learning_rate)
        if not self.policy.use_async and self._stale(grad_version):
            return PushResult(False, p.version)
        # Assigned, never optimised; the last writer wins. Before the update, so that a
        # checkpoint the update triggers holds it.
        p.state.update(state)
        if self.policy.use_async:
            return self._apply_async(dense, sparse, lr, grad_version)
        return self._accumulate_sync(dense, sparse, lr)

    def _apply_async(self, dense, sparse, lr, grad_version) -> PushResult:
        lr = self.optimizer.config.learning_rate if lr is None else lr
        if self.policy.lr_staleness_modulation:
            staleness = max(1, self.params.version - grad_version)
            lr /= staleness
        self._apply(dense, sparse, lr)
        return PushResult(True, self.params.version)

    def _stale(self, grad_version: int) -> bool:
        """Sync mode: gradients computed against a version too old are rejected."""
        p = self.params
        if grad_version >= p.version - self.policy.sync_version_tolerance:
            return False
        logger.debug(
            "PS %d rejects stale gradients of version %d (PS at %d, tolerance %d)",
            p.ps_id,
            grad_version,
            p.version,
            self.policy.sync_version_tolerance,
        )
        return True

    def _accumulate_sync(self, dense, sparse, lr) -> PushResult:
        p = self.params
        if self.policy.grads_to_wait == 1:
            # Nothing to average: apply in place, without copying the gradients into a buffer.
            self._apply(dense, sparse, lr or self.optimizer.config.learning_rate)
            return PushResult(True, p.version)
        self._buffer.add(dense, sparse, lr or 0.0)
        if self._buffer.count >= self.policy.grads_to_wait:
            buf, self._buffer = self._buffer, _SyncBuffer()
            scale = 1.0 / buf.count
            for grad in buf.dense.values():
                grad *= np.float32(scale)
            merged = {
                name: (np.concatenate([i for i, _ in parts]), np.concatenate([g for _, g in parts]))
                for name, parts in buf.sparse.items()
            }
            lr = buf.learning_rate or self.optimizer.config.learning_rate
            self._apply(buf.dense, merged, lr)
        return PushResult(True, p.version)

    def _apply(self, dense: dict, sparse: dict, lr: float) -> None:
        p = self.params
        step = p.version + 1
        self.optimizer.apply_dense(p, dense, lr, step)
        for name, (ids, grads) in sparse.items():
            # The ids passed check_grad (or are a concatenation of pushes that did).
            self.optimizer.apply_sparse(
                p.embedding_tables[name], ids, grads, lr, step, ids_checked=True
            )
        p.version += 1
        if self._on_version is not None:
            self._on_version(p.version)
