"""Test model for the master's end-to-end test: logistic regression on 4 float features.

Records: tf.train.Example with `x` = 4 floats and `label` = int64 in {0, 1}.
"""
import keras
import tensorflow as tf

from elasticdl.common.model_utils import Mode

_FEATURES = {
    "x": tf.io.FixedLenFeature([4], tf.float32),
    "label": tf.io.FixedLenFeature([], tf.int64, default_value=0),
}


def custom_model():
    inputs = keras.Input(shape=(4,), name="x")
    outputs = keras.layers.Dense(2, name="logits")(inputs)
    return keras.Model(inputs, outputs, name="tiny_linear")


def loss(labels, predictions):
    labels = tf.reshape(labels, [-1])
    return tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)
    )


def optimizer(lr=0.5):
    return keras.optimizers.SGD(learning_rate=lr)


def _parse(record):
    example = tf.io.parse_single_example(record, _FEATURES)
    return example["x"], example["label"]


def feed(dataset, mode, metadata):
    dataset = dataset.map(_parse)
    if mode == Mode.PREDICTION:
        dataset = dataset.map(lambda x, label: x)
    return dataset


def eval_metrics_fn():
    return {"accuracy": keras.metrics.SparseCategoricalAccuracy()}
