"""A batch built from a model's declared inputs, for building its variables before data."""
from __future__ import annotations

from typing import Any, Optional

import keras
import tensorflow as tf


def zeros_of_declared_inputs(model: keras.Model) -> Optional[Any]:
    """A batch of one all-zero example shaped like `model`'s declared inputs (unknown
    dimensions 1), in the inputs' own structure; None for a model that declares none (a
    subclassed model that never saw data)."""
    inputs = getattr(model, "inputs", None)
    if not inputs:
        return None
    # Keras 3 keeps a single input as a bare KerasTensor, which has no truth value.
    structure = getattr(model, "_inputs_struct", None)
    if structure is None:
        structure = inputs
    zeros = tf.nest.map_structure(
        lambda t: tf.zeros([1] + [d or 1 for d in t.shape[1:]], t.dtype), structure
    )
    if isinstance(zeros, list) and len(zeros) == 1:
        return zeros[0]
    return zeros
