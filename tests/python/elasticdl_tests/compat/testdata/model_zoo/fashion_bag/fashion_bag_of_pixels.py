# In the style of the original ElasticDL's sparse model files (written for these tests): the
# Embedding from the original's import path, its rows on the PS, fed a SparseTensor of ids per
# example and combining each example's bag of ids. The ids here are the positions of an image's
# bright pixels (original schema: `image` 784 floats 0..255), a variable-length bag per image.
import tensorflow as tf

from elasticdl.python.common.constants import Mode
from elasticdl.python.elasticdl.layers.embedding import Embedding


def custom_model(combiner="mean"):
    pixels = tf.keras.Input(shape=(None,), sparse=True, dtype="int64", name="pixels")
    x = Embedding(16, input_dim=784, combiner=combiner, name="pixel_embedding")(pixels)
    x = tf.keras.layers.Dense(64, activation="relu")(x)
    outputs = tf.keras.layers.Dense(10)(x)
    return tf.keras.Model(inputs=pixels, outputs=outputs, name="bag_of_pixels")


def loss(labels, predictions):
    labels = tf.reshape(labels, [-1])
    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(logits=predictions, labels=labels)
    )


def optimizer(lr=0.1):
    return tf.optimizers.SGD(lr)


def bright_pixels(image):
    """The ids of the pixels brighter than half scale, as a 1-D SparseTensor (a bag)."""
    ids = tf.where(tf.reshape(image, [-1]) > 127.0)[:, 0]
    positions = tf.expand_dims(tf.range(tf.size(ids, out_type=tf.int64)), 1)
    return tf.SparseTensor(positions, ids, dense_shape=[784])


def dataset_fn(dataset, mode, _):
    def _parse_data(record):
        description = {"image": tf.io.FixedLenFeature([784], tf.float32)}
        if mode != Mode.PREDICTION:
            description["label"] = tf.io.FixedLenFeature([1], tf.int64)
        r = tf.io.parse_single_example(record, description)
        features = {"pixels": bright_pixels(r["image"])}
        if mode == Mode.PREDICTION:
            return features
        return features, tf.cast(r["label"], tf.int32)

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
