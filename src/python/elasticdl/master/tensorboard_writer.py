"""``--tensorboard_log_dir``: the master writes TensorBoard event files of its job.

Two kinds of scalars, both against the model version as the step (as in the original
ElasticDL, so the loss and evaluation curves share one axis):

* ``loss``: the mean training loss of each task a worker reports (the same numbers as the job
  status's loss curve, without its thinning);
* every evaluation round's metrics under their names (``accuracy``, or ``output/name`` for
  models with several outputs), once the round is complete.

The events are plain ``Summary`` scalars written with TensorBoard's own event-file writer (no
TensorFlow needed), readable by ``tensorboard --logdir DIR`` and by
``tensorboard.backend.event_processing.event_accumulator.EventAccumulator``. Each master writes
its own file into the directory, so a restarted master continues the same run.
"""

from __future__ import annotations

import logging
import math
import os
import time

logger = logging.getLogger(__name__)

LOSS_TAG = "loss"
FLUSH_SECS = 5  # TensorBoard polls the files; a few seconds of delay is invisible there


class TensorBoardError(RuntimeError):
    """The directory cannot be written; the message names the flag."""


class TensorBoardWriter:
    def __init__(self, log_dir: str, flush_secs: float = FLUSH_SECS) -> None:
        # Imported here: only jobs with --tensorboard_log_dir need TensorBoard.
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.log_dir = log_dir
        try:
            if "://" not in log_dir:
                os.makedirs(log_dir, exist_ok=True)
            self._writer = EventFileWriter(log_dir, flush_secs=flush_secs)
        except OSError as e:
            raise TensorBoardError(
                f"--tensorboard_log_dir {log_dir!r} cannot be written: {e.strerror or e}; "
                "choose a writable directory"
            ) from None
        self._closed = False

    def add_loss(self, model_version: int, loss: float) -> None:
        self._add({LOSS_TAG: loss}, model_version)

    def add_evaluation(self, result) -> None:
        """An :class:`~elasticdl.master.evaluation_service.EvaluationResult`."""
        self._add(result.metrics, result.model_version)

    def _add(self, values: dict, step: int) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        if self._closed:
            return
        summary = summary_pb2.Summary(
            value=[
                summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
                for tag, value in values.items()
                if not math.isnan(float(value))
            ]
        )
        if not summary.value:
            return
        event = event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary)
        try:
            self._writer.add_event(event)
        except Exception as e:  # never fail the job for its TensorBoard log
            logger.warning("Cannot write to --tensorboard_log_dir %s: %s", self.log_dir, e)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._writer.close()
            except Exception as e:
                logger.warning("Cannot close the TensorBoard log in %s: %s", self.log_dir, e)
