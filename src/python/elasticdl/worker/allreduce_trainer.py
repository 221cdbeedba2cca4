"""AllReduce training of a model-zoo Keras model (``--distribution_strategy=AllreduceStrategy``).

Every worker holds the whole model and its own Keras optimizer; there is no PS. Data stays
dynamically sharded by the master (tasks, re-queued when a worker dies), so nothing has to be
re-partitioned when the group changes.

One *step* is one collective: every member contributes one flat float32 buffer

    [ sum of its gradients x its batch size | its batch size | leaving? | regroup? ]

and sums it with a single ``allreduce``. Dividing by the summed batch size gives the gradient
of the global batch (exact also when batches differ in size); every member applies it with its
local optimizer, so replicas stay identical. The trailing flags let the group take decisions
together without another round trip: a member that has no data right now (the master said WAIT)
takes part with batch size 0, a member that is done sets *leaving*, and rank 0, which asks the
master every ``check_rendezvous_s`` whether a newer generation exists (a worker joined or left),
sets *regroup*. After a step with either flag every remaining member rebuilds its group for the
new generation; rank 0 (the longest-serving member) then broadcasts the model and optimizer
state so newcomers start from the trained model.

A failed collective (a peer was killed) drops the group, re-joins the master's rendezvous and
retries the same minibatch, up to ``max_allreduce_retries`` times; after that the task fails and
the master re-queues it.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, List, Optional

import keras
import numpy as np
import tensorflow as tf
from elasticdl.common.model_utils import ModelSpec
from elasticdl.worker.allreduce_group import AllreduceMasterClient, CollectiveError, CommGroup
from elasticdl.worker.saved_model import batch_spec, write_saved_model
from elasticdl.worker.trainer import Trainer

logger = logging.getLogger(__name__)

DEFAULT_MAX_ALLREDUCE_RETRIES = 5
_HEADER = 3  # batch size, leaving, regroup


def numpy_dtype(variable) -> np.dtype:
    """A Keras 3 variable's dtype is a name ("float32"), a tf.keras (Keras 2) or tf.Variable's
    a ``tf.DType``, which NumPy cannot read."""
    return np.dtype(tf.as_dtype(variable.dtype).as_numpy_dtype)


class AllreduceFailedError(RuntimeError):
    """A minibatch could not be allreduced even after re-forming the group several times."""


@dataclass
class AllreduceTrainerConfig:
    max_allreduce_retries: int = DEFAULT_MAX_ALLREDUCE_RETRIES
    retry_sleep_s: float = 1.0
    check_rendezvous_s: float = 1.0  # how often rank 0 asks the master for a newer generation
    idle_sleep_s: float = 0.05  # pause after a step in which no member had data
    use_tf_function: bool = True


class AllreduceTrainer(Trainer):
    def __init__(
        self,
        spec: ModelSpec,
        group: CommGroup,
        master: AllreduceMasterClient,
        config: Optional[AllreduceTrainerConfig] = None,
    ):
        self.spec = spec
        self.group = group
        self.master = master
        self.config = config or AllreduceTrainerConfig()
        self.model: Optional[keras.Model] = None
        self.optimizer = None
        self.feature_spec = None
        self.steps = 0  # global steps applied (same on every member)
        self._vars: List[Any] = []
        self._sizes: List[int] = []
        self._buf: Optional[np.ndarray] = None
        self._grad_fn = None
        self._apply_fn = None
        self._predict_fn = None
        self._next_check = 0.0
        self._reported_version = -1

    # ------------------------------------------------------------------ model
    @property
    def model_version(self) -> int:
        return self.steps

    def ensure_model(self, features, model: Optional[keras.Model] = None) -> keras.Model:
        if self.model is not None:
            return self.model
        model = model if model is not None else self.spec.model_fn()
        model(features, training=False)  # creates the variables of subclassed models too
        self.feature_spec = batch_spec(features)
        self.optimizer = self.spec.optimizer()
        self._vars = list(model.trainable_variables)
        # Slots exist before the first broadcast, so newcomers receive them too.
        self.optimizer.build(self._vars)
        try:  # callbacks such as LearningRateScheduler reach the lr through model.optimizer
            model.compile(optimizer=self.optimizer)
        except Exception:  # pragma: no cover - exotic models
            logger.debug("model.compile(optimizer) failed", exc_info=True)
        self._sizes = [int(np.prod(v.shape)) for v in self._vars]
        self._buf = np.zeros(sum(self._sizes) + _HEADER, np.float32)
        self.model = model
        return model

    def pull_model(self, force: bool = False) -> None:
        """The local replica is the model: nothing to pull."""

    # ------------------------------------------------------------------ compiled pieces
    def _flat_grads(self, features, labels):
        with tf.GradientTape() as tape:
            outputs = self.model(features, training=True)
            loss = tf.reduce_mean(self.spec.loss(labels, outputs))
        grads = tape.gradient(loss, self._vars)
        flat = [
            tf.reshape(tf.zeros_like(v) if g is None else tf.convert_to_tensor(g), [-1])
            for g, v in zip(grads, self._vars)
        ]
        return loss, tf.cast(tf.concat(flat, 0), tf.float32)

    def _apply(self, flat):
        pieces = tf.split(flat, self._sizes)
        grads = [tf.cast(tf.reshape(p, v.shape), v.dtype) for p, v in zip(pieces, self._vars)]
        self.optimizer.apply_gradients(zip(grads, self._vars))

    def _compiled(self, fn):
        return tf.function(fn, reduce_retracing=True) if self.config.use_tf_function else fn

    def forward(self, features):
        if self._predict_fn is None:
            self._predict_fn = self._compiled(lambda x: self.model(x, training=False))
        return self._predict_fn(features)

    # ------------------------------------------------------------------ group state
    def _state_variables(self) -> List[Any]:
        return list(self.model.variables) + list(self.optimizer.variables)

    def _sync_state(self) -> None:
        """Everyone takes rank 0's model, optimizer state and step count."""
        if self.group.world_size <= 1:
            return
        variables = self._state_variables()
        by_dtype: dict = {}
        for v in variables:
            by_dtype.setdefault(numpy_dtype(v), []).append(v)
        for dtype, vs in sorted(by_dtype.items(), key=lambda kv: kv[0].str):
            flat = np.concatenate([np.asarray(v.numpy(), dtype).ravel() for v in vs])
            self.group.broadcast_(flat, root=0)
            if self.group.rank != 0:
                offset = 0
                for v in vs:
                    n = int(np.prod(v.shape))
                    v.assign(flat[offset : offset + n].reshape(v.shape))
                    offset += n
        steps = np.array([self.steps], np.float64)
        self.group.broadcast_(steps, root=0)
        self.steps = int(steps[0])

    def _ensure_member(self) -> None:
        while not self.group.is_member:
            self.group.join()
            try:
                self._sync_state()
            except CollectiveError as err:
                logger.warning("State broadcast failed, joining again: %s", err)
                self.group.drop(failed=True)
                continue
            except BaseException:
                # A member whose state was not synced must not train in the group: its
                # replica would differ from the others' while their gradients are summed.
                self.group.drop(failed=True)
                raise
            self.group.acknowledge()
            self._next_check = time.monotonic() + self.config.check_rendezvous_s

    def _regroup_wanted(self) -> bool:
        """Rank 0 only, at most every ``check_rendezvous_s``: a newer generation exists?"""
        if self.group.rank != 0 or time.monotonic() < self._next_check:
            return False
        self._next_check = time.monotonic() + self.config.check_rendezvous_s
        if self.steps != self._reported_version:  # the master's evaluation schedule follows it
            self.master.report_version(self.steps)
            self._reported_version = self.steps
        return self.group.new_generation_available()

    def _step(self, flat: Optional[np.ndarray], count: int, leaving: bool = False) -> float:
        """One collective step; returns the group's total batch size."""
        buf = self._buf
        n = buf.size - _HEADER
        if flat is None or count == 0:
            buf[:n] = 0.0
        else:
            np.multiply(flat, np.float32(count), out=buf[:n])
        buf[n] = count
        buf[n + 1] = 1.0 if leaving else 0.0
        buf[n + 2] = 1.0 if self._regroup_wanted() else 0.0
        self.group.allreduce_(buf)
        total = float(buf[n])
        if total > 0:
            np.divide(buf[:n], np.float32(total), out=buf[:n])
            self._apply_fn(tf.convert_to_tensor(buf[:n]))
            self.steps += 1
        if buf[n + 1] > 0 or buf[n + 2] > 0:
            # Membership changes after this step: everybody rebuilds for the next generation.
            self.group.drop(failed=False)
        return total

    def _collective_step(self, flat: Optional[np.ndarray], count: int) -> float:
        retries = self.config.max_allreduce_retries
        for attempt in range(retries + 1):
            try:
                self._ensure_member()
                return self._step(flat, count)
            except CollectiveError as err:
                self.group.drop(failed=True)
                if attempt == retries:
                    raise AllreduceFailedError(
                        f"allreduce failed {retries + 1} times (last: {err}); the master re-queues the task"
                    ) from err
                logger.warning(
                    "Allreduce failed (attempt %d/%d), re-forming the group: %s",
                    attempt + 1,
                    retries + 1,
                    err,
                )
                time.sleep(self.config.retry_sleep_s)
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ training
    def train_minibatch(self, features, labels, send_state: bool = False) -> float:
        """One global step; `send_state` is ignored: every replica holds all the model's
        variables, and a group that (re)forms broadcasts them (`_sync_state`)."""
        self.ensure_model(features)
        if self._grad_fn is None:
            self._grad_fn = self._compiled(self._flat_grads)
            self._apply_fn = self._compiled(self._apply)
        loss, flat = self._grad_fn(features, labels)
        count = int(tf.nest.flatten(labels)[0].shape[0])
        self._collective_step(flat.numpy(), count)
        return float(loss.numpy())

    def idle_step(self) -> bool:
        """The master has no task for us right now (WAIT): take part in the group's next step
        without data, so members that still train are not kept waiting. Returns False when this
        worker is in no group (the caller just sleeps)."""
        if self.model is None or self._apply_fn is None:
            return False
        total = self._collective_step(None, 0)
        if total == 0:
            time.sleep(self.config.idle_sleep_s)
        return True

    def leave(self) -> None:
        """No more work: announce it in one last step (so nobody waits for us), then leave."""
        if not self.group.is_member and self.group.joined and self.model is not None:
            # A generation that still counts on us may be forming: build it with the others
            # first, or they would wait for us until their collective timeout.
            try:
                self._ensure_member()
            except (CollectiveError, RuntimeError) as err:
                logger.info("Could not rejoin to leave cleanly: %s", err)
        if self.group.is_member:
            try:
                self._step(None, 0, leaving=True)
            except CollectiveError as err:
                logger.info("Leaving step failed (the group is re-forming anyway): %s", err)
        self.group.leave()

    # ------------------------------------------------------------------ export
    def export_saved_model(self, path: str) -> None:
        if self.model is None:
            raise RuntimeError("cannot export: the model was never built (no data seen)")
        write_saved_model(self.model, self.feature_spec, path)
        logger.info("Exported SavedModel (step %d) to %s", self.steps, path)
