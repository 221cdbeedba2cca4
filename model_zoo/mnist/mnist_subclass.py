"""The same CNN as mnist_functional_api, written as a subclassed keras.Model."""
import keras
import tensorflow as tf
from mnist.mnist_functional_api import (  # noqa: F401  (re-exported model-zoo contract)
    PredictionOutputsProcessor,
    eval_metrics_fn,
    feed,
    loss,
    optimizer,
)


class CustomModel(keras.Model):
    def __init__(self, num_classes=10, **kwargs):
        super().__init__(**kwargs)
        self.conv1 = keras.layers.Conv2D(32, 3, activation="relu", name="conv1")
        self.pool1 = keras.layers.MaxPooling2D(2)
        self.conv2 = keras.layers.Conv2D(64, 3, activation="relu", name="conv2")
        self.pool2 = keras.layers.MaxPooling2D(2)
        self.flatten = keras.layers.Flatten()
        self.hidden = keras.layers.Dense(128, activation="relu", name="hidden")
        self.logits = keras.layers.Dense(num_classes, name="logits")

    def call(self, inputs, training=False):
        x = tf.expand_dims(inputs, -1)
        x = self.pool1(self.conv1(x))
        x = self.pool2(self.conv2(x))
        return self.logits(self.hidden(self.flatten(x)))
