# A subclassed model in the style of the original ElasticDL model zoo (written for these tests):
# the model is a class taking keyword arguments (set with --model_params), the feed is `feed`,
# a LearningRateScheduler from the original's callbacks module follows the model version.
import tensorflow as tf

from elasticdl.python.common.constants import Mode
from elasticdl.python.elasticdl.callbacks import LearningRateScheduler
from model_zoo.mnist.mnist_functional_api import dataset_fn


class CustomModel(tf.keras.Model):
    def __init__(self, channel_last=True, hidden_units=32):
        super(CustomModel, self).__init__(name="mnist_model")
        if channel_last:
            self._reshape = tf.keras.layers.Reshape((28, 28, 1))
        else:
            self._reshape = tf.keras.layers.Reshape((1, 28, 28))
        self._conv1 = tf.keras.layers.Conv2D(16, kernel_size=(3, 3), activation="relu")
        self._maxpooling = tf.keras.layers.MaxPooling2D(pool_size=(2, 2))
        self._dropout = tf.keras.layers.Dropout(0.25)
        self._flatten = tf.keras.layers.Flatten()
        self._hidden = tf.keras.layers.Dense(hidden_units, activation="relu")
        self._dense = tf.keras.layers.Dense(10)

    def call(self, inputs, training=False):
        x = self._reshape(inputs["image"])
        x = self._conv1(x)
        x = self._maxpooling(x)
        if training:
            x = self._dropout(x, training=training)
        x = self._flatten(x)
        x = self._hidden(x)
        return self._dense(x)


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
        return 0.1 if model_version < 100 else 0.05

    return [LearningRateScheduler(_schedule)]


def feed(dataset, mode, metadata):
    return dataset_fn(dataset, mode, metadata)


def eval_metrics_fn():
    return {
        "accuracy": lambda labels, predictions: tf.equal(
            tf.argmax(predictions, 1, output_type=tf.int32),
            tf.cast(tf.reshape(labels, [-1]), tf.int32),
        )
    }
