"""The SavedModel a training job exports to `--output` (both strategies write the same)."""
from __future__ import annotations

import keras
import tensorflow as tf


def batch_spec(features):
    """The input signature of a batch like `features`, any batch size: a TensorSpec per tensor,
    a SparseTensorSpec / RaggedTensorSpec for sparse and ragged features."""

    def spec(t):
        shape = [None] + list(t.shape[1:])
        if isinstance(t, tf.SparseTensor):
            return tf.SparseTensorSpec(shape, t.dtype)
        if isinstance(t, tf.RaggedTensor):
            return tf.RaggedTensorSpec(
                shape, t.dtype, ragged_rank=t.ragged_rank, row_splits_dtype=t.row_splits.dtype
            )
        return tf.TensorSpec(shape, t.dtype)

    return tf.nest.map_structure(spec, features)


def write_saved_model(model: keras.Model, feature_spec, path: str) -> None:
    """Write `model` to `path` with one `serve` endpoint: inference mode (`training=False`)
    on a batch shaped like the training features (`feature_spec`, see `batch_spec`).
    Load it with `tf.saved_model.load(path).serve(features)`."""
    serve = tf.function(
        lambda x: model(x, training=False), input_signature=[feature_spec], autograph=False
    )
    # Traced here, so the archive takes it as it is: the archive's own signature conversion
    # knows dense tensors only, not sparse or ragged ones.
    serve.get_concrete_function()
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serve", serve)
    archive.write_out(path)
