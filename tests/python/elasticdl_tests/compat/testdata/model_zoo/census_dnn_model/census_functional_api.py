# A tf.keras 2.x model in the style of the original ElasticDL's census DNN (written for these
# tests): DenseFeatures over feature columns (gone from Keras 3, so the job runs it on tf-keras),
# a metric from tensorflow.python.keras, a sibling module imported through `model_zoo`.
import tensorflow as tf
from tensorflow.python.keras.metrics import accuracy

from model_zoo.census_dnn_model.census_feature_columns import (
    CATEGORICAL_FEATURE_KEYS,
    LABEL_KEY,
    NUMERIC_FEATURE_KEYS,
    get_feature_columns,
    get_feature_input_layers,
)


def custom_model():
    feature_input_layers = get_feature_input_layers()
    x = tf.keras.layers.DenseFeatures(get_feature_columns())(feature_input_layers)
    x = tf.keras.layers.Dense(16, activation="relu")(x)
    x = tf.keras.layers.Dense(16, activation="relu")(x)
    y = tf.keras.layers.Dense(1, activation="sigmoid")(x)
    return tf.keras.Model(inputs=feature_input_layers, outputs=y)


def loss(labels, predictions):
    labels = tf.expand_dims(labels, axis=1)
    return tf.keras.losses.binary_crossentropy(labels, predictions)


def optimizer():
    return tf.keras.optimizers.Adam()


def eval_metrics_fn():
    return {
        "accuracy": lambda labels, predictions: accuracy(
            tf.cast(tf.squeeze(tf.round(predictions)), tf.int32),
            tf.cast(labels, tf.int32),
        )
    }


def feed(dataset, mode, _):
    def _parse_data(record):
        feature_description = dict(
            [(name, tf.io.FixedLenFeature([], tf.string)) for name in CATEGORICAL_FEATURE_KEYS]
            + [(name, tf.io.FixedLenFeature([], tf.float32)) for name in NUMERIC_FEATURE_KEYS]
            + [(LABEL_KEY, tf.io.FixedLenFeature([], tf.int64))]
        )
        parsed_record = tf.io.parse_single_example(record, feature_description)
        label = parsed_record.pop(LABEL_KEY)
        return parsed_record, label

    return dataset.map(_parse_data)
