# In the style of the original ElasticDL's cifar10 model files (written for these tests): a
# sibling module imported through the `model_zoo` package, callbacks and the prediction outputs
# processor from the original's import paths, ODPS only when configured.
import os

import tensorflow as tf

from elasticdl.python.common.constants import MaxComputeConfig, Mode
from elasticdl.python.common.log_utils import default_logger as logger
from elasticdl.python.data.odps_io import ODPSWriter, is_odps_configured
from elasticdl.python.elasticdl.callbacks import LearningRateScheduler
from elasticdl.python.worker.prediction_outputs_processor import (
    BasePredictionOutputsProcessor,
)
from model_zoo.fashion.data_parser import parse_data


def custom_model(filters=32):
    inputs = tf.keras.layers.Input(shape=(28, 28), name="image")
    x = tf.keras.layers.Reshape((28, 28, 1))(inputs)
    x = tf.keras.layers.Conv2D(filters, kernel_size=(3, 3), padding="same")(x)
    x = tf.keras.layers.BatchNormalization(epsilon=1e-06, axis=-1, momentum=0.9)(x)
    x = tf.keras.layers.Activation(tf.nn.relu)(x)
    x = tf.keras.layers.MaxPooling2D(pool_size=(2, 2))(x)
    x = tf.keras.layers.Dropout(0.2)(x)
    x = tf.keras.layers.Flatten()(x)
    outputs = tf.keras.layers.Dense(10, name="output")(x)
    return tf.keras.Model(inputs=inputs, outputs=outputs, name="fashion_model")


def loss(labels, predictions):
    labels = tf.reshape(labels, [-1])
    return tf.reduce_mean(
        input_tensor=tf.nn.sparse_softmax_cross_entropy_with_logits(
            logits=predictions, labels=labels
        )
    )


def optimizer(lr=0.1):
    return tf.optimizers.SGD(lr)


def callbacks():
    def _schedule(model_version):
        if model_version < 5000:
            return 0.1
        return 0.01

    return [LearningRateScheduler(_schedule)]


def dataset_fn(dataset, mode, _):
    def _parse_data(record):
        return parse_data(record, mode)

    dataset = dataset.map(_parse_data)
    if mode == Mode.TRAINING:
        dataset = dataset.shuffle(buffer_size=1024)
    return dataset


def eval_metrics_fn():
    return {
        "accuracy": lambda labels, predictions: tf.equal(
            tf.argmax(predictions, 1, output_type=tf.int32),
            tf.cast(tf.reshape(labels, [-1]), tf.int32),
        )
    }


class PredictionOutputsProcessor(BasePredictionOutputsProcessor):
    def __init__(self):
        if is_odps_configured():
            self.odps_writer = ODPSWriter(
                os.environ[MaxComputeConfig.PROJECT_NAME],
                os.environ[MaxComputeConfig.ACCESS_ID],
                os.environ[MaxComputeConfig.ACCESS_KEY],
                os.environ[MaxComputeConfig.ENDPOINT],
                "fashion_prediction_outputs",
                columns=["f" + str(i) for i in range(10)],
                column_types=["double" for _ in range(10)],
            )
        else:
            self.odps_writer = None

    def process(self, predictions, worker_id):
        if self.odps_writer:
            self.odps_writer.from_iterator(iter(predictions.numpy().tolist()), worker_id)
        else:
            logger.info(predictions.numpy())
