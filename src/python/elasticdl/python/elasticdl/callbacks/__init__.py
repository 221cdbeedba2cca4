"""``elasticdl.python.elasticdl.callbacks``: the callbacks the worker runs
(:mod:`elasticdl.worker.callbacks`)."""
from elasticdl.worker.callbacks import LearningRateScheduler, MaxStepsStopping, SavedModelExporter

__all__ = ["LearningRateScheduler", "MaxStepsStopping", "SavedModelExporter"]
