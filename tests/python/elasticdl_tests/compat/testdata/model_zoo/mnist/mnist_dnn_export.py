# In the style of the original ElasticDL's model files (written for these tests): the
# SavedModelExporter callback from the original's import path, and a PredictionOutputsProcessor
# that writes what it is handed (`predictions.numpy()`, as the original's processors did) to a
# CSV file per worker under $PREDICTION_OUTPUTS_DIR, set with the job's --envs.
import os

import numpy as np
import tensorflow as tf

from elasticdl.python.common.constants import Mode
from elasticdl.python.elasticdl.callbacks import SavedModelExporter
from elasticdl.python.worker.prediction_outputs_processor import (
    BasePredictionOutputsProcessor,
)


def custom_model(hidden_units=64):
    inputs = tf.keras.Input(shape=(28, 28), name="image")
    x = tf.keras.layers.Flatten()(inputs)
    x = tf.keras.layers.Dense(hidden_units, activation="relu")(x)
    outputs = tf.keras.layers.Dense(10)(x)
    return tf.keras.Model(inputs=inputs, outputs=outputs, name="mnist_dnn")


def loss(labels, predictions):
    labels = tf.reshape(labels, [-1])
    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(logits=predictions, labels=labels)
    )


def optimizer(lr=0.1):
    return tf.optimizers.SGD(lr)


def callbacks():
    return [SavedModelExporter()]


def dataset_fn(dataset, mode, _):
    def _parse_data(record):
        description = {"image": tf.io.FixedLenFeature([28, 28], tf.float32)}
        if mode != Mode.PREDICTION:
            description["label"] = tf.io.FixedLenFeature([1], tf.int64)
        r = tf.io.parse_single_example(record, description)
        features = {"image": r["image"] / 255.0}
        if mode == Mode.PREDICTION:
            return features
        return features, tf.cast(r["label"], tf.int32)

    return dataset.map(_parse_data)


def eval_metrics_fn():
    return {
        "accuracy": lambda labels, predictions: tf.equal(
            tf.argmax(predictions, 1, output_type=tf.int32),
            tf.cast(tf.reshape(labels, [-1]), tf.int32),
        )
    }


class PredictionOutputsProcessor(BasePredictionOutputsProcessor):
    def __init__(self):
        self.output_dir = os.environ["PREDICTION_OUTPUTS_DIR"]

    def process(self, predictions, worker_id):
        path = os.path.join(self.output_dir, "worker-%d.csv" % worker_id)
        with open(path, "a") as f:
            np.savetxt(f, tf.nn.softmax(predictions).numpy(), delimiter=",", fmt="%.6f")
