# Feature columns in the style of the original ElasticDL's census DNN (written for these tests):
# tf.feature_column and the original's embedding_column over the original generator's census
# columns, for tf.keras 2 DenseFeatures.
import tensorflow as tf

from elasticdl.python.elasticdl.feature_column import feature_column

CATEGORICAL_FEATURE_KEYS = [
    "workclass",
    "education",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "native-country",
]
NUMERIC_FEATURE_KEYS = ["age", "capital-gain", "capital-loss", "hours-per-week"]
LABEL_KEY = "label"


def get_feature_columns():
    feature_columns = []
    for key in NUMERIC_FEATURE_KEYS:
        feature_columns.append(tf.feature_column.numeric_column(key, normalizer_fn=tf.math.log1p))
    for key in CATEGORICAL_FEATURE_KEYS:
        feature_columns.append(
            feature_column.embedding_column(
                tf.feature_column.categorical_column_with_hash_bucket(key, hash_bucket_size=64),
                dimension=8,
            )
        )
    return feature_columns


def get_feature_input_layers():
    feature_input_layers = {}
    for key in NUMERIC_FEATURE_KEYS:
        feature_input_layers[key] = tf.keras.Input(shape=(1,), name=key, dtype=tf.float32)
    for key in CATEGORICAL_FEATURE_KEYS:
        feature_input_layers[key] = tf.keras.Input(shape=(1,), name=key, dtype=tf.string)
    return feature_input_layers
