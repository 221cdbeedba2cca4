"""``elasticdl.python.elasticdl.callbacks.max_steps_stopping``, where the original's
MaxStepsStopping lived for a while (:class:`elasticdl.worker.callbacks.MaxStepsStopping`)."""
from elasticdl.worker.callbacks import MaxStepsStopping

__all__ = ["MaxStepsStopping"]
