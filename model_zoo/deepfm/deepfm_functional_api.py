"""DeepFM on MovieLens ratings: does the user like the movie (rating >= 4)?

Records: tf.train.Example with `user_id` int64, `movie_id` int64, `rating` float and `label`
int64 (1 if rating >= 4). The embedding tables use `elasticdl.worker.layers.Embedding`, so they
live on the parameter servers (rows sharded by id % num_ps, created on first use) and only the
rows of a batch's ids travel.
"""
import keras
import tensorflow as tf
from elasticdl.common.model_utils import Mode
from elasticdl.worker.layers import Embedding

FIELDS = ("user_id", "movie_id")
EMBEDDING_DIM = 8
# Upper bound of the ids (MovieLens 100k/1M fit); only used to export a fixed-size table.
MAX_ID = 10000


def custom_model():
    inputs = {f: keras.Input(shape=(1,), name=f, dtype="int64") for f in FIELDS}
    vectors, first_order = [], []
    for f in FIELDS:
        vectors.append(
            Embedding(EMBEDDING_DIM, input_dim=MAX_ID, name=f"{f}_embedding", combiner="sum")(
                inputs[f]
            )
        )
        first_order.append(
            Embedding(1, input_dim=MAX_ID, name=f"{f}_bias", combiner="sum")(inputs[f])
        )
    stacked = keras.layers.Lambda(lambda v: tf.stack(v, axis=1), name="stack")(vectors)
    # FM second order: 0.5 * ((sum v)^2 - sum v^2), summed over the embedding dimension.
    fm = keras.layers.Lambda(
        lambda s: 0.5
        * tf.reduce_sum(
            tf.square(tf.reduce_sum(s, axis=1)) - tf.reduce_sum(tf.square(s), axis=1),
            axis=1,
            keepdims=True,
        ),
        name="fm",
    )(stacked)
    linear = keras.layers.Add(name="linear")(first_order)
    x = keras.layers.Concatenate(name="deep_in")(vectors)
    x = keras.layers.Dense(32, activation="relu", name="deep1")(x)
    x = keras.layers.Dense(16, activation="relu", name="deep2")(x)
    deep = keras.layers.Dense(1, name="deep_out")(x)
    logit = keras.layers.Add(name="logit")([linear, fm, deep])
    return keras.Model(inputs, logit, name="deepfm")


def loss(labels, predictions):
    labels = tf.cast(tf.reshape(labels, [-1, 1]), tf.float32)
    return tf.reduce_mean(keras.losses.binary_crossentropy(labels, predictions, from_logits=True))


def optimizer(lr=0.001):
    return keras.optimizers.Adam(learning_rate=lr)


_SPEC = {
    "user_id": tf.io.FixedLenFeature([1], tf.int64),
    "movie_id": tf.io.FixedLenFeature([1], tf.int64),
    "label": tf.io.FixedLenFeature([1], tf.int64, default_value=[0]),
}


def _parse(record):
    ex = tf.io.parse_single_example(record, _SPEC)
    return {f: ex[f] for f in FIELDS}, ex["label"]


def feed(dataset, mode, metadata):
    dataset = dataset.map(_parse, num_parallel_calls=tf.data.AUTOTUNE)
    if mode == Mode.TRAINING:
        dataset = dataset.shuffle(1024)
    if mode == Mode.PREDICTION:
        dataset = dataset.map(lambda features, label: features)
    return dataset


def eval_metrics_fn():
    def accuracy(labels, predictions):
        labels = tf.cast(tf.reshape(labels, [-1]), tf.int64)
        predicted = tf.cast(tf.reshape(predictions, [-1]) > 0.0, tf.int64)
        return tf.cast(tf.equal(predicted, labels), tf.float32)

    return {"accuracy": accuracy}
