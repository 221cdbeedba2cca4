"""DeepFM on `synthetic_ctr` clicks (`elasticdl dataset prepare synthetic_ctr`).

Records: `dense` (13 floats), `categorical` (one id in [0, vocab) per feature), `label`. All
categorical features share one table of `features * vocab` rows (feature f's ids are offset by
f * vocab), so a minibatch pulls and pushes one set of rows. `embedding="elasticdl"` (default)
puts the table on the parameter servers (`elasticdl.worker.layers.Embedding`: rows created on
first use, only a batch's rows travel); `embedding="keras"` is a `keras.layers.Embedding` of the
same size, for a plain single-process Keras loop to compare with.

    --model_def=deepfm.deepfm_ctr.custom_model --model_params "features=26; vocab=38462"
"""
import keras
import numpy as np
import tensorflow as tf
from elasticdl.common.model_utils import Mode
from elasticdl.worker.layers import Embedding

NUM_DENSE = 13
EMBEDDING_DIM = 8


def custom_model(features=26, vocab=38462, embedding="elasticdl"):
    if embedding not in ("elasticdl", "keras"):
        raise ValueError(f"embedding must be 'elasticdl' or 'keras', got {embedding!r}")
    rows = int(features) * int(vocab)
    dense = keras.Input(shape=(NUM_DENSE,), name="dense")
    ids = keras.Input(shape=(int(features),), name="categorical", dtype="int64")
    offsets = tf.constant(np.arange(int(features), dtype=np.int64) * int(vocab))
    table_ids = keras.layers.Lambda(
        lambda x: x + offsets, output_shape=(int(features),), name="table_ids"
    )(ids)
    if embedding == "keras":
        vectors = keras.layers.Embedding(rows, EMBEDDING_DIM, name="embedding")(table_ids)
        weights = keras.layers.Embedding(rows, 1, name="first_order")(table_ids)
    else:
        vectors = Embedding(EMBEDDING_DIM, input_dim=rows, name="embedding")(table_ids)
        weights = Embedding(1, input_dim=rows, name="first_order")(table_ids)
    # First order: the ids' weights and a linear term of the dense features.
    linear = keras.layers.Lambda(
        lambda w: tf.reduce_sum(w, axis=[1, 2])[:, None], output_shape=(1,), name="ids_w"
    )(weights)
    dense_linear = keras.layers.Dense(1, name="dense_linear")(dense)
    # FM second order: 0.5 * ((sum v)^2 - sum v^2), summed over the embedding dimension.
    fm = keras.layers.Lambda(
        lambda v: 0.5
        * tf.reduce_sum(
            tf.square(tf.reduce_sum(v, axis=1)) - tf.reduce_sum(tf.square(v), axis=1),
            axis=1,
            keepdims=True,
        ),
        output_shape=(1,),
        name="fm",
    )(vectors)
    x = keras.layers.Concatenate(name="deep_in")([keras.layers.Flatten()(vectors), dense])
    x = keras.layers.Dense(64, activation="relu", name="deep1")(x)
    x = keras.layers.Dense(32, activation="relu", name="deep2")(x)
    deep = keras.layers.Dense(1, name="deep_out")(x)
    logit = keras.layers.Add(name="logit")([linear, dense_linear, fm, deep])
    return keras.Model({"dense": dense, "categorical": ids}, logit, name="deepfm_ctr")


def loss(labels, predictions):
    labels = tf.cast(tf.reshape(labels, [-1, 1]), tf.float32)
    return tf.reduce_mean(keras.losses.binary_crossentropy(labels, predictions, from_logits=True))


def optimizer(lr=0.001):
    return keras.optimizers.Adam(learning_rate=lr)


def sgd_optimizer(lr=0.05):
    """`--optimizer=sgd_optimizer`: plain SGD, which Keras applies to an Embedding's rows
    sparsely (its Adam updates every row of the table each step)."""
    return keras.optimizers.SGD(learning_rate=lr)


_SPEC = {
    "dense": tf.io.FixedLenFeature([NUM_DENSE], tf.float32),
    "categorical": tf.io.FixedLenSequenceFeature([], tf.int64, allow_missing=True),
    "label": tf.io.FixedLenFeature([1], tf.int64, default_value=[0]),
}


def _parse(record):
    ex = tf.io.parse_single_example(record, _SPEC)
    return {"dense": ex["dense"], "categorical": ex["categorical"]}, ex["label"]


def feed(dataset, mode, metadata):
    dataset = dataset.map(_parse, num_parallel_calls=tf.data.AUTOTUNE)
    if mode == Mode.PREDICTION:
        dataset = dataset.map(lambda features, label: features)
    return dataset


def eval_metrics_fn():
    return {"auc": keras.metrics.AUC(num_thresholds=2000, from_logits=True)}
