"""Callbacks a model file may return from `callbacks()`.

The worker calls `on_train_batch_begin(version)` / `on_train_batch_end(version)` with the PS
model version as the "batch", so schedules follow global progress, not one worker's steps.
Standard Keras callbacks are accepted too and get the same calls. `on_train_end` runs once per
training job, on the worker that gets the master's train-end task, after every record trained.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

import keras

logger = logging.getLogger(__name__)


class LearningRateScheduler(keras.callbacks.Callback):
    """Sets the learning rate sent with each gradient push to `schedule(model_version)`."""

    def __init__(self, schedule: Callable[[int], float]):
        super().__init__()
        self.schedule = schedule

    def on_train_batch_begin(self, batch, logs=None):
        lr = float(self.schedule(int(batch)))
        self.model.optimizer.learning_rate = lr


class MaxStepsStopping(keras.callbacks.Callback):
    """Stops training once the model version reaches `max_steps`; later training tasks are
    acknowledged without training so the job can finish (and still export its model)."""

    def __init__(self, max_steps: int):
        super().__init__()
        if int(max_steps) <= 0:
            raise ValueError(f"MaxStepsStopping max_steps must be positive, got {max_steps}")
        self.max_steps = int(max_steps)

    def on_train_batch_end(self, batch, logs=None):
        if int(batch) >= self.max_steps and not self.model.stop_training:
            logger.info(
                "Model version %d reached max_steps %d: stop training", batch, self.max_steps
            )
            self.model.stop_training = True


class SavedModelExporter(keras.callbacks.Callback):
    """Exports the trained model as a SavedModel to the job's `--output` when training ends.

    Every training job with `--output` exports this way: the worker adds one of these when the
    model file lists none (as the original ElasticDL did), so listing it in `callbacks()`
    changes nothing but where it runs among the others. The export itself is the trainer's
    (PS: the newest parameters and whole embedding tables pulled from the PS; AllReduce: the
    worker's replica), handed over by the worker with `bind`. The original's constructor
    arguments (task data service, feed, model handler) are accepted and not needed.
    """

    def __init__(self, task_data_service=None, feed=None, model_handler=None):
        super().__init__()
        self._export: Optional[Callable[[str], None]] = None
        self._path = ""

    def bind(self, export: Callable[[str], None], saved_model_path: str) -> None:
        self._export = export
        self._path = saved_model_path

    def on_train_end(self, logs=None):
        if not self._path:
            logger.info("No --output: the SavedModel is not exported")
            return
        if self._export is None:
            raise RuntimeError("SavedModelExporter runs inside an ElasticDL worker only")
        self._export(self._path)


class BasePredictionOutputsProcessor:
    """Base for a model file's `PredictionOutputsProcessor`: receives each prediction batch."""

    def process(self, predictions, worker_id: int) -> None:  # pragma: no cover - interface
        raise NotImplementedError
