"""``elasticdl.python.worker.prediction_outputs_processor``: the base class of a model file's
``PredictionOutputsProcessor`` (:class:`elasticdl.worker.callbacks.BasePredictionOutputsProcessor`)."""
from elasticdl.worker.callbacks import BasePredictionOutputsProcessor

__all__ = ["BasePredictionOutputsProcessor"]
