"""Parameter-server training of a model-zoo Keras model.

The worker holds a replica of the dense parameters and no embedding tables. Per minibatch:
pull dense parameters newer than the local copy (every `get_model_steps` steps), compute the
loss and gradients in a `tf.function`, push the gradients with the current learning rate. PS in
sync mode may reject a gradient computed against a stale version; the minibatch is then retried
against freshly pulled parameters, up to `max_minibatch_retries` times.

The PS is initialised lazily by the workers: the first worker to build the model pushes it; the
PS keep the first model they receive, and every worker then pulls the PS's values, so all
replicas start from the same point. A PS that restarted without a checkpoint reports
`initialized=false`; the worker then pushes its current parameters again.

With an asynchronous PS (`TrainerConfig.overlap_pushes`, set from `--use_async`) the push runs
on a background thread while the next minibatch's step runs on parameters one push older (and
embedding rows that may predate that push's update): the worker waits for a push's answer only
after the next step, before it sends the next push. So at most one push per PS is in flight, its
staleness is bounded by one step, and `wait_for_pushes` (the worker calls it before reporting a
training task done) holds until every push of the task was answered, raising the error of one
that failed, so the task fails and is re-queued as when a push fails in sync mode.

Non-trainable variables (BatchNormalization's moving statistics) are the model's *state*: the
gradient step updates them locally, the last push of every training task carries their values
to the PS (assigned there, never optimised), a task that ends before that push (a callback
stopped training) sends them alone (`deliver_state`), and a worker takes the PS's values once,
when it builds the model, so a relaunched worker and evaluation/prediction jobs from a
checkpoint use the trained statistics. The project's own embedding layers are not state: their
tables live on the PS as embedding tables.
"""
from __future__ import annotations

import logging
import time
from concurrent import futures
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import grpc
import keras
import numpy as np
import tensorflow as tf
from elasticdl.common.model_utils import ModelSpec
from elasticdl.common.tensor_utils import aligned_copy
from elasticdl.worker.layers import Embedding, SharedLookups, find_embedding_layers
from elasticdl.worker.ps_client import (
    EmbeddingTableInfo,
    PackedGradients,
    PackedLayout,
    PSClient,
    PullResult,
)
from elasticdl.worker.ps_types import DistinctIdRows
from elasticdl.worker.saved_model import batch_spec, write_saved_model
from elasticdl.worker.trainer import Trainer

logger = logging.getLogger(__name__)

DEFAULT_MAX_MINIBATCH_RETRIES = 64


class _NotPackable(Exception):
    """Raised while tracing the packed step: some variable has no gradient."""


class WorkerStuckError(RuntimeError):
    """The PS kept rejecting this worker's gradients."""


class PSNotInitializedError(RuntimeError):
    """Evaluation/prediction found a PS without a model (no checkpoint to start from)."""


class PSRefusedModelError(RuntimeError):
    """A PS refused the model: its embedding tables (e.g. they cannot fit in its memory) or its
    initial state (a NaN, a shape other than the PS holds): the message is the PS's one line."""


@dataclass
class TrainerConfig:
    get_model_steps: int = 1  # pull dense parameters every N local steps (async only)
    max_minibatch_retries: int = DEFAULT_MAX_MINIBATCH_RETRIES
    use_tf_function: bool = True
    init_model_on_ps: bool = True  # False for evaluation/prediction-only jobs
    wait_for_ps_model_s: float = 60.0  # how long those jobs wait for the PS to hold a model
    # Async PS only: a push is answered while the next step runs (see the module docstring).
    # A sync PS would reject those gradients as stale, and rows one step stale are an async
    # trade-off, so the worker sets it from --use_async.
    overlap_pushes: bool = False


class PushRejectedError(RuntimeError):
    """A push sent while the next step ran was not accepted: its minibatch is lost, so the
    task that trained it must fail and run again."""


def _variable_path(v) -> str:
    """Keras 3 variables have a unique `path` ("dense/kernel"); TensorFlow variables of
    tf.keras 2 models (tf-keras) have only `name` ("dense/kernel:0")."""
    path = getattr(v, "path", None)
    if path:
        return path
    name = v.name
    return name[: -len(":0")] if name.endswith(":0") else name


def _param_names(variables) -> List[str]:
    names = [_variable_path(v) for v in variables]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(
            f"model variables have duplicate paths {dup}: give the layers unique names"
        )
    return names


def _state_variables(model, embedding_layers) -> List[Any]:
    """The model's non-trainable float variables, without the embedding layers' (a local copy
    of a PS table, made for export) and without integer ones (e.g. a Dropout's seed)."""
    skip = {id(v) for layer in embedding_layers for v in layer.weights}
    return [
        v
        for v in model.non_trainable_variables
        if id(v) not in skip and tf.as_dtype(v.dtype).is_floating
    ]


def _dense(grad):
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.convert_to_tensor(grad)  # sums duplicate indices
    return grad


class PSTrainer(Trainer):
    def __init__(
        self, spec: ModelSpec, ps_client: PSClient, config: Optional[TrainerConfig] = None
    ):
        self.spec = spec
        self.ps = ps_client
        self.config = config or TrainerConfig()
        self.model: Optional[keras.Model] = None
        self.optimizer = None
        self.embedding_layers: List[Embedding] = []
        self._shared_lookups = SharedLookups(self._lookup_many)
        self._vars: List[Any] = []
        self._names: List[str] = []
        self._var_by_name: Dict[str, Any] = {}
        self._state_vars: List[Any] = []  # non-trainable variables (see the module docstring)
        self._state_by_name: Dict[str, Any] = {}
        # Steps trained since the state last reached the PS (see deliver_state).
        self._state_undelivered = False
        self._push_state_unsupported = False  # a PS answered push_state with UNIMPLEMENTED
        self._steps_since_pull = 0
        self._need_pull = True
        self._pushed_version = 0  # PS version right after this worker's last accepted push
        self.steps = 0  # minibatches whose gradients the PS accepted
        self.feature_spec = None  # TensorSpec structure of the inputs (for export)
        self._train_fn = None
        # Packed path (shared memory with every PS, see _packed_step): the compiled step, the
        # layout it was traced for, and parameters pulled but not yet assigned.
        self._packed_fn = None
        self._packed_fn_layout = None
        self._packed_ok = True
        self._pending: Optional[PullResult] = None
        self._predict_fn = None
        self._assign_fn = None
        self._learning_rate: Optional[float] = None
        # Overlapped pushes (config.overlap_pushes): the thread that sends them and the one in
        # flight (its future, and whether it carried the model's state).
        self._push_pool: Optional[futures.ThreadPoolExecutor] = None
        self._push_in_flight: Optional[Tuple[futures.Future, bool]] = None

    def replace_ps_client(self, ps_client: PSClient) -> PSClient:
        """Train through ``ps_client`` (the job's new PS set) from the next step on; returns
        the old client. The new PS hold the model the old ones held (restored from their
        snapshot), so the local model is only brought up to them by a forced pull."""
        old, self.ps = self.ps, ps_client
        self._pending = None  # parameters the old PS sent: the next pull brings them again
        self._need_pull = True
        self._packed_fn = self._packed_fn_layout = None  # traced for the old PS's blocks
        if self.model is not None:
            ps_client.set_dense_layout({n: v.numpy() for n, v in zip(self._names, self._vars)})
            self.pull_model(force=True, include_state=True)
        return old

    # ------------------------------------------------------------------ model setup
    @property
    def model_version(self) -> int:
        """Newest PS version this worker knows of (pulled, or reported after its own push)."""
        return max(0, max(self.ps.ps_versions), self._pushed_version)

    @property
    def learning_rate(self) -> float:
        """The worker's current lr, sent with every push. Reading the optimizer's variable
        is a TF op per minibatch, so it is cached: only callbacks change it (the worker's
        optimizer never steps, so a schedule stays at step 0), and the worker calls
        `learning_rate_may_have_changed` after running any."""
        if self._learning_rate is None:
            self._learning_rate = float(np.asarray(self.optimizer.learning_rate))
        return self._learning_rate

    def learning_rate_may_have_changed(self) -> None:
        self._learning_rate = None

    def embedding_infos(self) -> List[EmbeddingTableInfo]:
        return [
            EmbeddingTableInfo(
                name=l.name,
                dim=l.output_dim,
                initializer=l.embeddings_initializer,
                vocabulary=l.input_dim or 0,
            )
            for l in self.embedding_layers
        ]

    def _push_embedding_table_infos(self) -> None:
        try:
            self.ps.push_embedding_table_infos(self.embedding_infos())
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.INVALID_ARGUMENT:  # no use retrying: say why
                raise PSRefusedModelError(err.details()) from None
            raise

    def ensure_model(self, features, model: Optional[keras.Model] = None) -> keras.Model:
        """Build the model on the first batch, initialise the PS, and sync from it."""
        if self.model is not None:
            return self.model
        model = model if model is not None else self.spec.model_fn()
        self.optimizer = self.spec.optimizer()
        self.embedding_layers = find_embedding_layers(model)
        for layer in self.embedding_layers:
            layer.set_lookup_fn(self._lookup)
            layer.set_shared_lookups(self._shared_lookups)
        if self.config.init_model_on_ps:
            # Rows are created lazily by the PS on first pull, so tables must be known first.
            self._push_embedding_table_infos()
        self._shared_lookups.reset()
        model(features, training=False)  # creates the variables of subclassed models too
        self._shared_lookups.reset()
        for layer in self.embedding_layers:
            layer.reset_records()
        self.feature_spec = batch_spec(features)
        self.model = model
        try:  # callbacks such as LearningRateScheduler reach the lr through model.optimizer
            model.compile(optimizer=self.optimizer)
        except Exception:  # pragma: no cover - exotic models; the lr then comes from self.optimizer
            logger.debug("model.compile(optimizer) failed", exc_info=True)
        self._vars = list(model.trainable_variables)
        self._state_vars = _state_variables(model, self.embedding_layers)
        names = _param_names(self._vars + self._state_vars)
        self._names = names[: len(self._vars)]
        self._var_by_name = dict(zip(self._names, self._vars))
        self._state_by_name = dict(zip(names[len(self._vars) :], self._state_vars))
        # Pushes may then move the dense gradients and parameters through shared memory.
        self.ps.set_dense_layout({n: v.numpy() for n, v in zip(self._names, self._vars)})
        if self.config.init_model_on_ps:
            self._push_model()
        self.pull_model(force=True, include_state=True)
        return model

    def _push_model(self) -> None:
        params = {n: v.numpy() for n, v in zip(self._names, self._vars)}
        try:
            self.ps.push_model(params, self.embedding_infos(), version=0, state=self.read_state())
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.INVALID_ARGUMENT:  # e.g. NaN state: say why
                raise PSRefusedModelError(err.details()) from None
            raise

    def read_state(self) -> Dict[str, np.ndarray]:
        """The current values of the model's non-trainable state variables."""
        return {n: v.numpy() for n, v in self._state_by_name.items()}

    def _assign_state(self, state: Dict[str, np.ndarray]) -> None:
        unknown = sorted(set(state) - set(self._state_by_name))
        if unknown:
            raise ValueError(
                f"PS holds state variables {unknown[:3]} that the model does not have: the PS "
                "was initialised with a different model definition"
            )
        for name, value in state.items():
            self._state_by_name[name].assign(value)
        missing = sorted(set(self._state_by_name) - set(state))
        if missing:
            logger.info(
                "PS hold no value for %d non-trainable variables (%s%s): they keep their "
                "initial values (a checkpoint written before the PS kept model state?)",
                len(missing),
                ", ".join(missing[:3]),
                ", ..." if len(missing) > 3 else "",
            )

    def _lookup(self, name: str, ids: np.ndarray) -> np.ndarray:
        dim = next((l.output_dim for l in self.embedding_layers if l.name == name), None)
        # The layer looks up tf.unique's output: no second de-duplication in the client.
        return self.ps.pull_embedding_vectors(name, ids, dim=dim, ids_unique=True)

    def _lookup_many(self, tables, ids: np.ndarray) -> List[np.ndarray]:
        # The group's leader looks up tf.unique's output too.
        return self.ps.pull_rows_of_tables(tables, ids, ids_unique=True)

    def pull_model(self, force: bool = False, include_state: bool = False) -> None:
        """Bring the local dense parameters up to the PS's (re-initialising a restarted PS);
        with `include_state`, the non-trainable state too."""
        self.wait_for_pushes()  # the PS's answer to a push in flight first: it may bring some
        self.flush_pending_assign()  # a pull sends only what is newer than what we hold
        include_state = include_state and bool(self._state_by_name)
        deadline = time.monotonic() + self.config.wait_for_ps_model_s
        while True:
            result = self.ps.pull_dense_parameters(force=force, include_state=include_state)
            if result.all_initialized:
                break
            if self.config.init_model_on_ps:
                logger.warning(
                    "PS %s hold no model (restarted?): pushing the local model again",
                    result.uninitialized_ps,
                )
                self._push_embedding_table_infos()
                self._push_model()
            elif time.monotonic() > deadline:
                raise PSNotInitializedError(
                    f"PS {result.uninitialized_ps} hold no model after "
                    f"{self.config.wait_for_ps_model_s:.0f}s: start the job with "
                    "--checkpoint_dir_for_init pointing at a checkpoint version directory"
                )
            else:
                time.sleep(1.0)
            force = True
        self._assign(result.parameters)
        if include_state:
            self._assign_state(result.state)
            self._state_undelivered = False  # the local state is now the PS's
        self._steps_since_pull = 0
        self._need_pull = False

    def _assign(self, params: Dict[str, np.ndarray]) -> None:
        for name in params:
            if name not in self._var_by_name:
                raise ValueError(
                    f"PS holds parameter {name!r} that the model does not have: the PS was "
                    "initialised with a different model definition"
                )
        if self.config.use_tf_function and len(params) == len(self._vars):
            # Every parameter (the usual pull): one compiled call instead of one eager
            # `assign` per variable, each of which costs about a millisecond.
            if self._assign_fn is None:
                variables = self._vars

                def assign_all(values):
                    for var, value in zip(variables, values):
                        var.assign(value)

                self._assign_fn = tf.function(assign_all)
            self._assign_fn(tuple(params[n] for n in self._names))
            return
        for name, value in params.items():
            self._var_by_name[name].assign(value)

    # ------------------------------------------------------------------ compiled steps
    def _forward_backward(self, features, labels):
        self._shared_lookups.reset()  # the layers' pulls group anew in every trace
        with tf.GradientTape() as tape:
            for layer in self.embedding_layers:
                layer.set_tape(tape)
                layer.reset_records()
            outputs = self.model(features, training=True)
            loss = self.spec.loss(labels, outputs)
            loss = tf.reduce_mean(loss)  # a per-sample loss becomes the batch mean
        self._shared_lookups.reset()
        records = [(layer.name, r) for layer in self.embedding_layers for r in layer.records]
        for layer in self.embedding_layers:
            layer.set_tape(None)
            layer.reset_records()
        grads = tape.gradient(loss, self._vars + [r.vectors for _, r in records])
        dense = [_dense(g) for g in grads[: len(self._vars)]]
        sparse = [(r.unique_ids, _dense(g)) for (_, r), g in zip(records, grads[len(self._vars) :])]
        # Table names are static per trace; keep them on the Python side.
        self._record_names = [name for name, _ in records]
        return loss, dense, sparse

    def _get_train_fn(self):
        if self._train_fn is None:
            fn = self._forward_backward
            self._train_fn = (
                tf.function(fn, reduce_retracing=True) if self.config.use_tf_function else fn
            )
        return self._train_fn

    def forward(self, features):
        """Model outputs for evaluation/prediction (training=False)."""
        self.wait_for_pushes()
        self.flush_pending_assign()
        if self._predict_fn is None:

            def predict(x):
                for layer in self.embedding_layers:
                    layer.set_tape(None)
                    layer.reset_records()
                self._shared_lookups.reset()
                out = self.model(x, training=False)
                self._shared_lookups.reset()
                for layer in self.embedding_layers:
                    layer.reset_records()
                return out

            self._predict_fn = (
                tf.function(predict, reduce_retracing=True)
                if self.config.use_tf_function
                else predict
            )
        return self._predict_fn(features)

    def compute_gradients(self, features, labels) -> Tuple[float, Dict[str, np.ndarray], Dict]:
        loss, dense, sparse = self._get_train_fn()(features, labels)
        dense_grads = {name: g.numpy() for name, g in zip(self._names, dense) if g is not None}
        return float(loss.numpy()), dense_grads, self._embedding_grads(sparse)

    def _embedding_grads(self, sparse) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
        """Table name -> (rows, ids). One call of a layer gives rows for its unique ids
        (`DistinctIdRows`); a layer called more than once gives a concatenation, which may
        repeat ids and is summed before the push."""
        embedding_grads: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}
        for name, (ids, g) in zip(self._record_names, sparse):
            if g is None:
                continue
            ids, g = ids.numpy(), g.numpy()
            if name in embedding_grads:
                prev_g, prev_ids = embedding_grads[name]
                embedding_grads[name] = (
                    np.concatenate([prev_g, g]),
                    np.concatenate([prev_ids, ids]),
                )
            else:
                embedding_grads[name] = DistinctIdRows(g, ids)
        return embedding_grads

    # ------------------------------------------------------------------ training
    def train_minibatch(self, features, labels, send_state: bool = False) -> float:
        """Train one minibatch through the PS; returns its loss. `send_state`: the push also
        carries the model's non-trainable state (the worker sets it on a task's last minibatch)."""
        self.ensure_model(features)
        if self.config.overlap_pushes:
            return self._train_overlapped(features, labels, send_state)
        retries = self.config.max_minibatch_retries
        get_model_steps = max(1, self.config.get_model_steps)
        for _ in range(retries):
            layout, (loss, dense_grads, embedding_grads) = self._pull_and_step(features, labels)
            # When the next step will need fresh parameters (always in sync mode), they come
            # back with this push: one round trip per minibatch instead of two.
            pull = self._steps_since_pull + 1 >= get_model_steps
            state = self.read_state() if send_state and self._state_by_name else None
            result = self.ps.push_gradients(
                dense_grads, embedding_grads, self.learning_rate, pull_dense=pull, state=state
            )
            pulled = result.pulled if pull else None
            if pulled is not None and pulled.all_initialized:
                pending = self._in_blocks(layout, pulled, keep=False)
                if pending is not None:
                    self._pending = pending  # assigned by the next step, in the same call
                else:
                    self._assign(pulled.parameters)
            if result.accepted:
                self._pushed_version = max(result.versions.values(), default=0)
                self.steps += 1
                self._state_undelivered = state is None and bool(self._state_by_name)
                self._steps_since_pull += 1
                if pulled is not None:
                    # Fresh unless a PS was uninitialised (then pull_model re-initialises it).
                    self._steps_since_pull = 0
                    self._need_pull = not pulled.all_initialized
                return loss
            # Sync PS rejected a stale gradient: recompute against the newest parameters,
            # which came back with the rejection unless the PS predates that.
            self._need_pull = pulled is None or not pulled.all_initialized
        raise WorkerStuckError(
            f"the PS rejected this worker's gradients {retries} times in a row (stale model "
            "version in sync mode): raise --sync_version_tolerance or use --use_async"
        )

    def deliver_state(self) -> None:
        """Send the model's state alone when steps trained since it last reached the PS (a
        training task that ended before its last push, which carries it, e.g. stopped by a
        callback). The worker calls it whenever a training task ends well, and only then: a
        task that failed is run again, so its statistics reach the PS with the next task that
        ends well (this flag stays set), and a failure is often the PS's, which would only
        turn a second call into a second error hiding the first."""
        self.wait_for_pushes()  # the last push may carry the state
        if not self._state_undelivered or self._push_state_unsupported:
            return
        try:
            taken = self.ps.push_state(self.read_state())
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            logger.warning(
                "a PS predates push_state: the statistics of a training task cut short reach "
                "it with the last push of this worker's next training task"
            )
            self._push_state_unsupported = True
            return
        if taken:
            self._state_undelivered = False
        else:  # the next pull offers the model again, with the state it has then
            logger.info("a PS holds no model (restarted?): the state waits for the next push")

    def _pull_and_step(self, features, labels):
        """The PS's parameters first when due (a pull waits for a push in flight), then one
        gradient step: (the packed layout or None, (loss, dense grads, embedding grads))."""
        if self._need_pull or self._steps_since_pull >= max(1, self.config.get_model_steps):
            self.pull_model()
        layout = self._packed_layout()
        if layout is not None:
            return layout, self._packed_step(layout, features, labels)
        self.flush_pending_assign()
        return None, self.compute_gradients(features, labels)

    # ------------------------------------------------------------------ overlapped pushes
    def _train_overlapped(self, features, labels, send_state: bool) -> float:
        """One step while the previous minibatch's push is in flight; then that push's answer
        is taken and this minibatch's push sent (see the module docstring)."""
        _, (loss, dense_grads, embedding_grads) = self._pull_and_step(features, labels)
        # The answer to the previous push: its parameters are in the regions until this push.
        self.wait_for_pushes()
        pull = self._steps_since_pull + 1 >= max(1, self.config.get_model_steps)
        state = self.read_state() if send_state and self._state_by_name else None
        if self._push_pool is None:
            self._push_pool = futures.ThreadPoolExecutor(1, thread_name_prefix="ps-push")
        future = self._push_pool.submit(
            self.ps.push_gradients,
            dense_grads,
            embedding_grads,
            self.learning_rate,
            pull_dense=pull,
            state=state,
        )
        self._push_in_flight = (future, state is not None)
        return loss

    def wait_for_pushes(self) -> None:
        """Until the PS answered every push sent so far (overlapped pushes; nothing to wait for
        otherwise), its parameters taken for the next step. Raises the error of a push that
        failed, or PushRejectedError, once: the push is forgotten either way."""
        in_flight, self._push_in_flight = self._push_in_flight, None
        if in_flight is None:
            return
        future, carried_state = in_flight
        result = future.result()
        pulled = result.pulled
        if pulled is not None and pulled.all_initialized:
            pending = self._in_blocks(self._packed_layout(), pulled, keep=True)
            if pending is not None:
                self._pending = pending  # every parameter: what an older one held is in it
            else:
                self.flush_pending_assign()
                self._assign(pulled.parameters)
        if not result.accepted:
            self._need_pull = True  # a PS without a model is offered it again before next step
            raise PushRejectedError(
                "a PS did not accept a push sent while the next step ran (it holds no model, "
                "e.g. relaunched without a checkpoint, or runs in sync mode): the task runs again"
            )
        self._pushed_version = max(result.versions.values(), default=0)
        self.steps += 1
        self._state_undelivered = not carried_state and bool(self._state_by_name)
        self._steps_since_pull += 1
        if pulled is not None:
            self._steps_since_pull = 0
            self._need_pull = not pulled.all_initialized

    def _in_blocks(
        self, layout: Optional[PackedLayout], pulled: PullResult, keep: bool
    ) -> Optional[PullResult]:
        """`pulled` as the packed step laid out by `layout` takes it; None when it cannot (the
        caller then assigns the parameters at once).

        - Blocks the worker owns (`blocks_are_views` false: an answer's block, or a copy) are
          taken as they are.
        - Views of memory shared with a PS (a region's parameter block) are taken as they are
          when the step reads them before the next push, and copied when `keep`: the next
          push's answer overwrites the region while the step after it has yet to read them.
        - Parameters that came one by one are packed into fresh blocks, which needs every
          dense parameter of the layout.

        Every copy or fresh block starts at a 64-byte boundary, as TensorFlow takes it."""
        if layout is None:
            return None
        if pulled.blocks is not None and (not keep or not pulled.blocks_are_views):
            return pulled
        if pulled.blocks is not None:
            blocks = {ps_id: aligned_copy(b) for ps_id, b in pulled.blocks.items()}
        else:
            blocks = layout.pack(pulled.parameters)
            if blocks is None:
                return None
        params: Dict[str, np.ndarray] = {}
        for ps_id, block in blocks.items():
            params.update(layout.unpack(ps_id, block))
        if params.keys() != set(self._names):
            return None
        return PullResult([], params, blocks, blocks_are_views=False)

    # ------------------------------------------------------------------ packed path
    # One compiled call per minibatch assigns the parameters the previous push brought back,
    # computes the gradients and returns them as one flat block per PS. When every dense
    # parameter travels through packed shared-memory regions, the call reads the region's flat
    # parameter block and the push copies the gradient block into the region at once; when
    # they travel in messages, the PS sends the parameters as one block that the call takes as
    # it is (one PS that sends them tensor by tensor has them packed into a block first), and
    # the push sends views of the gradient block. That saves a compiled call per minibatch
    # (the assign) and a conversion and copy per variable. The parameters a push brings back
    # wait in `_pending` until that call; anything else that reads the model first calls
    # `flush_pending_assign`.
    def _packed_layout(self) -> Optional[PackedLayout]:
        if not self._packed_ok or not self.config.use_tf_function:
            return None
        layout = self.ps.packed_layout()
        if layout is None or layout == self._packed_fn_layout:
            return layout  # the layout the step was traced for was checked then
        names = {n for _, entries in layout.entries for n, *_ in entries}
        return layout if names == set(self._names) else None

    def flush_pending_assign(self) -> None:
        """Assign parameters a push brought back that the next step has not assigned yet."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._assign(pending.parameters)

    def _packed_step(self, layout: PackedLayout, features, labels):
        if self._packed_fn is None or self._packed_fn_layout != layout:
            self._packed_fn = tf.function(self._packed_plan(layout), reduce_retracing=True)
            self._packed_fn_layout = layout
        pending, self._pending = self._pending, None
        blocks = ()
        if pending is not None:
            blocks = tuple(pending.blocks.get(ps_id) for ps_id, _ in layout.entries)
            if any(b is None for b in blocks):
                self._assign(pending.parameters)
                blocks = ()
        try:
            loss, grad_blocks, sparse = self._packed_fn(features, labels, blocks)
        except _NotPackable:
            # A variable got no gradient: the PS must not see a zero for it. Back to the
            # per-variable path for good (the pending parameters were not assigned).
            logger.info("a model variable has no gradient: dense gradients travel per variable")
            self._packed_ok = False
            self._pending = pending
            self.flush_pending_assign()
            return self.compute_gradients(features, labels)
        dense = PackedGradients(
            layout, {ps_id: g.numpy() for (ps_id, _), g in zip(layout.entries, grad_blocks)}
        )
        return float(loss.numpy()), dense, self._embedding_grads(sparse)

    def _packed_plan(self, layout: PackedLayout):
        index = {n: i for i, n in enumerate(self._names)}
        plan = [[(index[n], o, k, shape) for n, o, k, shape in e] for _, e in layout.entries]
        variables = self._vars

        def step(features, labels, blocks):
            for entries, block in zip(plan, blocks):  # blocks: () when nothing was pulled
                for i, o, k, shape in entries:
                    variables[i].assign(tf.reshape(block[o : o + k], shape))
            loss, dense, sparse = self._forward_backward(features, labels)
            if any(g is None for g in dense):
                raise _NotPackable()
            grads = tuple(
                tf.concat([tf.reshape(dense[i], [-1]) for i, *_ in entries], 0) for entries in plan
            )
            return loss, grads, sparse

        return step

    # ------------------------------------------------------------------ export
    def materialize_embeddings(self) -> None:
        """Copy every embedding table from the PS into its layer (for a self-contained export)."""
        for layer in self.embedding_layers:
            if layer.input_dim:
                ids = np.arange(layer.input_dim, dtype=np.int64)
                table = self.ps.pull_embedding_vectors(layer.name, ids, dim=layer.output_dim)
            else:
                rows = self.ps.pull_embedding_table(layer.name)
                size = int(rows.indices.max()) + 1 if rows.indices.size else 1
                table = np.zeros((size, layer.output_dim), np.float32)
                table[rows.indices] = rows.values
            layer.set_local_table(table)

    def export_saved_model(self, path: str) -> None:
        """Pull the newest model from the PS and write a SavedModel with a `serve` endpoint."""
        if self.model is None:
            raise RuntimeError("cannot export: the model was never built (no data seen)")
        self.pull_model(force=True, include_state=True)
        self.materialize_embeddings()
        write_saved_model(self.model, self.feature_spec, path)
        logger.info("Exported SavedModel (version %d) to %s", self.model_version, path)
