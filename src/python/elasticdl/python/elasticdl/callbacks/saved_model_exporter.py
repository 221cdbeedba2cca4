"""``elasticdl.python.elasticdl.callbacks.saved_model_exporter``, where the original's
SavedModelExporter lived for a while (:class:`elasticdl.worker.callbacks.SavedModelExporter`)."""
from elasticdl.worker.callbacks import SavedModelExporter

__all__ = ["SavedModelExporter"]
