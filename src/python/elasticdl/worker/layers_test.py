"""The PS-backed Embedding's Keras arguments of the original ElasticDL: mask_zero, input_length."""
import keras
import numpy as np
import tensorflow as tf
from elasticdl.worker.layers import Embedding


class _MaskedSum(keras.layers.Layer):
    """Sums the vectors the mask keeps (like the original DeepFM file's ApplyMask)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def compute_mask(self, inputs, mask=None):
        return None

    def call(self, x, mask=None):
        return tf.reduce_sum(x * tf.cast(tf.expand_dims(mask, -1), x.dtype), axis=1)


def _table(dim):
    return np.arange(5 * dim, dtype=np.float32).reshape(5, dim)


def test_mask_zero_masks_padding_ids_for_the_next_layer():
    layer = Embedding(output_dim=2, mask_zero=True, input_length=3)
    ids = keras.Input(shape=(3,), dtype="int64")
    model = keras.Model(ids, _MaskedSum()(layer(ids)))
    layer.set_local_table(_table(2))
    out = model(np.array([[1, 0, 2], [0, 0, 4]]))
    np.testing.assert_array_equal(out.numpy(), [[2 + 4, 3 + 5], [8, 9]])
    np.testing.assert_array_equal(
        layer.compute_mask(np.array([[1, 0, 2]])).numpy(), [[True, False, True]]
    )
    config = layer.get_config()
    assert config["mask_zero"] is True and config["input_length"] == 3
    assert Embedding.from_config(config).mask_zero


def test_no_mask_by_default_or_with_a_combiner_and_input_length_fills_the_shape():
    assert Embedding(output_dim=2).compute_mask(np.array([[0, 1]])) is None
    assert (
        Embedding(output_dim=2, mask_zero=True, combiner="sum").compute_mask(np.array([[0, 1]]))
        is None
    )
    assert Embedding(output_dim=4, input_length=10).compute_output_shape((None, None)) == (
        None,
        10,
        4,
    )
