"""Wide & Deep on the UCI adult census table (label: income > 50K).

Records: tf.train.Example with every adult column as a feature, names lowercased with '-', '.'
and spaces turned into '_' (`hours_per_week`, `native_country`, ...): numeric columns as
float_list, string columns as bytes_list; `label` = int64 0/1.

Categorical strings are hashed into fixed-size vocabularies (no vocabulary files to ship):
the wide part is a linear model over the hashed ids, the deep part an MLP over their
embeddings and the scaled numeric columns. Column names differ between copies of the data
(`gender`/`sex`, `educational_num`/`education_num`); each feature lists its aliases and the
feed takes whichever is present.
"""
import keras
import tensorflow as tf
from elasticdl.common.model_utils import Mode

# feature -> (aliases, scale): value / scale keeps inputs around [0, few].
NUMERIC = {
    "age": (("age",), 100.0),
    "fnlwgt": (("fnlwgt", "final_weight"), 1e6),
    "education_num": (("educational_num", "education_num"), 20.0),
    "capital_gain": (("capital_gain",), None),  # log1p-scaled: heavy tail
    "capital_loss": (("capital_loss",), None),
    "hours_per_week": (("hours_per_week",), 100.0),
}
# feature -> (aliases, hash buckets)
CATEGORICAL = {
    "workclass": (("workclass",), 16),
    "education": (("education",), 32),
    "marital_status": (("marital_status",), 16),
    "occupation": (("occupation",), 32),
    "relationship": (("relationship",), 16),
    "race": (("race",), 8),
    "gender": (("gender", "sex"), 4),
    "native_country": (("native_country",), 64),
}
EMBEDDING_DIM = 8


def custom_model():
    inputs, wide, deep = {}, [], []
    for name in NUMERIC:
        inputs[name] = keras.Input(shape=(1,), name=name, dtype="float32")
        deep.append(inputs[name])
    for name, (_, buckets) in CATEGORICAL.items():
        inputs[name] = keras.Input(shape=(1,), name=name, dtype="string")
        ids = keras.layers.Hashing(num_bins=buckets, name=f"{name}_hash")(inputs[name])
        wide.append(
            keras.layers.CategoryEncoding(buckets, output_mode="one_hot", name=f"{name}_onehot")(
                ids
            )
        )
        emb = keras.layers.Embedding(buckets, EMBEDDING_DIM, name=f"{name}_embedding")(ids)
        deep.append(keras.layers.Flatten(name=f"{name}_flat")(emb))
    wide_logit = keras.layers.Dense(1, name="wide")(keras.layers.Concatenate()(wide))
    x = keras.layers.Concatenate()(deep)
    x = keras.layers.Dense(64, activation="relu", name="deep1")(x)
    x = keras.layers.Dense(32, activation="relu", name="deep2")(x)
    deep_logit = keras.layers.Dense(1, name="deep_out")(x)
    logit = keras.layers.Add(name="logit")([wide_logit, deep_logit])
    return keras.Model(inputs, logit, name="wide_deep")


def loss(labels, predictions):
    labels = tf.cast(tf.reshape(labels, [-1, 1]), tf.float32)
    return tf.reduce_mean(keras.losses.binary_crossentropy(labels, predictions, from_logits=True))


def optimizer(lr=0.01):
    return keras.optimizers.Adam(learning_rate=lr)


def _spec():
    spec = {"label": tf.io.FixedLenFeature([1], tf.int64, default_value=[0])}
    for aliases, _ in NUMERIC.values():
        for a in aliases:
            spec[a] = tf.io.FixedLenFeature([1], tf.float32, default_value=[0.0])
    for aliases, _ in CATEGORICAL.values():
        for a in aliases:
            spec[a] = tf.io.FixedLenFeature([1], tf.string, default_value=[""])
    return spec


_SPEC = _spec()


def _parse(record):
    ex = tf.io.parse_single_example(record, _SPEC)
    features = {}
    for name, (aliases, scale) in NUMERIC.items():
        value = tf.add_n([ex[a] for a in aliases])  # absent aliases parse as 0
        features[name] = value / scale if scale else tf.math.log1p(tf.maximum(value, 0.0))
    for name, (aliases, _) in CATEGORICAL.items():
        value = ex[aliases[0]]
        for a in aliases[1:]:  # absent aliases parse as ""
            value = tf.strings.join([value, ex[a]])
        features[name] = tf.strings.lower(tf.strings.strip(value))
    return features, ex["label"]


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
