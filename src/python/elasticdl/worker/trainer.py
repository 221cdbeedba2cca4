"""What the worker needs from a trainer: the one interface of the parameter-server trainer
(``worker.ps_trainer.PSTrainer``) and the AllReduce trainer
(``worker.allreduce_trainer.AllreduceTrainer``).

The worker runs tasks (``worker.worker``); a trainer owns the model and how its gradients are
combined with the other workers'. Hooks that only one kind of training needs have a no-op
default here, so the worker calls every one of them unconditionally.
"""

from __future__ import annotations

import abc
from typing import Any, Optional

import keras
from elasticdl.common.model_utils import ModelSpec
from elasticdl.worker.model_inputs import zeros_of_declared_inputs


class Trainer(abc.ABC):
    spec: ModelSpec
    model: Optional[keras.Model] = None
    steps: int = 0  # minibatches this worker's training applied

    @property
    @abc.abstractmethod
    def model_version(self) -> int:
        """The model version the worker's results are counted against."""

    @abc.abstractmethod
    def ensure_model(self, features, model: Optional[keras.Model] = None) -> keras.Model:
        """Build the model on its first batch (``model``: one already made from the model
        function), and bring it to the job's current values."""

    def ensure_model_without_data(self) -> bool:
        """Build the model from its declared inputs (functional models) when no batch was seen.

        Returns False when that is impossible (a subclassed model that never saw data)."""
        if self.model is not None:
            return True
        probe = self.spec.model_fn()
        zeros = zeros_of_declared_inputs(probe)
        if zeros is None:
            return False
        # Reuse the probe: a second model would get other auto-generated variable names.
        self.ensure_model(zeros, model=probe)
        return True

    @abc.abstractmethod
    def train_minibatch(self, features, labels, send_state: bool = False) -> float:
        """One step; the minibatch's loss. ``send_state``: the task's last minibatch."""

    @abc.abstractmethod
    def forward(self, features) -> Any:
        """The model's outputs (evaluation, prediction)."""

    @abc.abstractmethod
    def pull_model(self, force: bool = False) -> None:
        """Bring the local model to the job's newest values before evaluating or predicting."""

    @abc.abstractmethod
    def export_saved_model(self, path: str) -> None:
        """Write the trained model as a SavedModel into ``path``."""

    def learning_rate_may_have_changed(self) -> None:
        """Callbacks ran (a LearningRateScheduler may have set the rate)."""

    def flush_pending_assign(self) -> None:
        """Callbacks are about to read the weights: apply what the last step brought back."""

    def wait_for_pushes(self) -> None:
        """Until the job holds every update of the steps trained so far (a trainer that sends
        them in the background); raises the error of one that failed. The worker calls it
        before it reports a training task done."""

    def deliver_state(self) -> None:
        """A task ended before its last step: hand its non-trainable state to the job."""

    def idle_step(self) -> bool:
        """The master has no task for now: True if a step without data was taken (so the
        worker does not sleep), False if there is nothing to do meanwhile."""
        return False

    def leave(self) -> None:
        """The worker is done: leave whatever it takes part in."""
