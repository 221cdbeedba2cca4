"""The chaos suite's job: softmax regression on Fashion-MNIST with L2 weight decay, trained
with a learning rate that decays with the model version to a small final value.

Its end point must not depend on the order of the asynchronous updates, or on a minibatch
repeated at a worker kill or lost at a PS restore, so that the chaos job and its undisturbed
twin can be compared within a point. The zoo's CNN cannot: trained 3 epochs at a constant rate,
seeded runs of it spread over 1.6-3 points. Here the loss is strongly convex (L2), so it has
one minimum, and the final rate is small, so both jobs end near it: seeded runs agree within a
few tenths of a point (see ../README.md). A linear model also trains many steps per second, so
the job gets near that minimum in the CI test's wall time.

Fixed initial weights too (``SEED``), so the two jobs start from the same model. The decay runs
over ``SEEDED_MNIST_DECAY_VERSIONS`` model versions (the job's minibatches, set by the test
with ``--envs``) and stays at its end value after them.
"""
import os

import keras
import tensorflow as tf
from elasticdl.worker.callbacks import LearningRateScheduler
from mnist.mnist_functional_api import (  # noqa: F401  (the zoo's data format and metric)
    IMAGE_SIZE,
    NUM_CLASSES,
    eval_metrics_fn,
    feed,
)

SEED = 17
L2 = 3e-4
LR_START = 0.03
LR_END = 1e-4
DECAY_VERSIONS_ENV = "SEEDED_MNIST_DECAY_VERSIONS"

_models: list = []  # the model this process built: the loss adds its weight decay


def custom_model():
    keras.utils.set_random_seed(SEED)
    inputs = keras.Input(shape=(IMAGE_SIZE, IMAGE_SIZE), name="image")
    x = keras.layers.Flatten()(inputs)
    outputs = keras.layers.Dense(
        NUM_CLASSES, kernel_regularizer=keras.regularizers.L2(L2), name="logits"
    )(x)
    model = keras.Model(inputs, outputs, name="softmax_regression")
    _models[:] = [model]
    return model


def loss(labels, predictions):
    labels = tf.reshape(labels, [-1])
    cross_entropy = tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)
    )
    # The worker's loss is this function alone (not model.losses): add the decay here.
    return cross_entropy + tf.add_n(_models[-1].losses)


def optimizer(lr=LR_START):
    return keras.optimizers.Adam(learning_rate=lr)


def learning_rate(version: int) -> float:
    total = max(1, int(os.environ.get(DECAY_VERSIONS_ENV, "1000")))
    return LR_START * (LR_END / LR_START) ** min(1.0, version / total)


def callbacks():
    return [LearningRateScheduler(learning_rate)]
