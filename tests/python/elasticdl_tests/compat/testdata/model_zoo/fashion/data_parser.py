import tensorflow as tf

from elasticdl.python.common.constants import Mode


def parse_data(record, mode):
    if mode == Mode.PREDICTION:
        feature_description = {"image": tf.io.FixedLenFeature([28, 28], tf.float32)}
    else:
        feature_description = {
            "image": tf.io.FixedLenFeature([28, 28], tf.float32),
            "label": tf.io.FixedLenFeature([1], tf.int64),
        }
    r = tf.io.parse_single_example(record, feature_description)
    features = {"image": tf.math.divide(tf.cast(r["image"], tf.float32), 255.0)}
    if mode == Mode.PREDICTION:
        return features
    return features, tf.cast(r["label"], tf.int32)
