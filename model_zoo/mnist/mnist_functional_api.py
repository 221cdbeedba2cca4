"""Small CNN for 28x28 grey images in 10 classes (MNIST / Fashion-MNIST RecordIO).

Records: serialized tf.train.Example with `image` = one bytes value of 784 raw uint8 pixels
(row-major 28x28) and `label` = int64 in [0, 9].
"""
import keras
import tensorflow as tf
from elasticdl.common.model_utils import Mode

IMAGE_SIZE = 28
NUM_CLASSES = 10


def custom_model():
    inputs = keras.Input(shape=(IMAGE_SIZE, IMAGE_SIZE), name="image")
    x = keras.layers.Reshape((IMAGE_SIZE, IMAGE_SIZE, 1))(inputs)
    x = keras.layers.Conv2D(32, 3, activation="relu", name="conv1")(x)
    x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Conv2D(64, 3, activation="relu", name="conv2")(x)
    x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(128, activation="relu", name="hidden")(x)
    outputs = keras.layers.Dense(NUM_CLASSES, name="logits")(x)
    return keras.Model(inputs, outputs, name="mnist_model")


def loss(labels, predictions):
    labels = tf.reshape(labels, [-1])
    return tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)
    )


def optimizer(lr=0.001):
    # Adam (slots on the PS): ~0.86 test accuracy after one epoch of the README job, where
    # SGD(0.1) stays near 0.81-0.82, too close to the 0.80 the README promises.
    return keras.optimizers.Adam(learning_rate=lr)


_FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64, default_value=0),
}


def _parse(record):
    example = tf.io.parse_single_example(record, _FEATURES)
    image = tf.io.decode_raw(example["image"], tf.uint8)
    image = tf.cast(tf.reshape(image, [IMAGE_SIZE, IMAGE_SIZE]), tf.float32) / 255.0
    return image, example["label"]


def feed(dataset, mode, metadata):
    dataset = dataset.map(_parse, num_parallel_calls=tf.data.AUTOTUNE)
    if mode == Mode.TRAINING:
        dataset = dataset.shuffle(1024)
    if mode == Mode.PREDICTION:
        dataset = dataset.map(lambda image, label: image)
    return dataset


def eval_metrics_fn():
    def accuracy(labels, predictions):
        labels = tf.cast(tf.reshape(labels, [-1]), tf.int64)
        return tf.cast(tf.equal(tf.argmax(predictions, axis=1), labels), tf.float32)

    return {"accuracy": accuracy}


class PredictionOutputsProcessor:
    """Logs the predicted classes (a model file may write them anywhere instead)."""

    def process(self, predictions, worker_id):
        import logging

        classes = tf.argmax(predictions, axis=1).numpy().tolist()
        logging.getLogger(__name__).info("worker %d predicted %s", worker_id, classes[:16])
