"""``elasticdl.python.elasticdl.layers.embedding``: the Embedding whose rows live on the
parameter servers (:class:`elasticdl.worker.layers.Embedding`)."""
from elasticdl.worker.layers import Embedding

__all__ = ["Embedding"]
