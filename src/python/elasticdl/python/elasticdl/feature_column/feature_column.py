"""``elasticdl.python.elasticdl.feature_column.feature_column``: ``embedding_column``.

The original ElasticDL's embedding column kept its table on the parameter servers. Here it is
TensorFlow's ``tf.feature_column.embedding_column``: the table is an ordinary variable of the
model's ``DenseFeatures`` layer, trained on the PS as a dense parameter (or allreduced), so model
files that build their columns with it run unchanged. Feature columns need ``tf.keras`` 2: a
model file importing this module runs on tf-keras (``elasticdl.common.runtime_env``).
"""
import tensorflow as tf

__all__ = ["embedding_column"]


def embedding_column(categorical_column, dimension, combiner="mean", initializer=None, **kwargs):
    return tf.feature_column.embedding_column(
        categorical_column, dimension, combiner=combiner, initializer=initializer, **kwargs
    )
