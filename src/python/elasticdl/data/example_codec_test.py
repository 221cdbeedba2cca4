import sys

import numpy as np
import pytest
from elasticdl.data.example_codec import (
    ExampleCodecError,
    Feature,
    bytes_feature,
    decode_example,
    decode_example_values,
    encode_example,
    float_feature,
    int64_feature,
)


def test_codec_does_not_import_tensorflow():
    import subprocess

    code = "import sys, elasticdl.data.example_codec; assert 'tensorflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": ":".join(sys.path)})


FEATURES = {
    "image": bytes_feature(bytes(range(256)) * 3 + b"\x00" * 16),
    "label": int64_feature([7]),
    "neg": int64_feature([-1, 0, 1, -(2**63), 2**63 - 1, 300]),
    "dense": float_feature([0.5, -2.25, 1e30, 3.0]),
    "words": ["héllo", b"world", ""],
    "empty_f": float_feature([]),
    "inferred_int": np.array([1, 2, 3], np.int32),
    "inferred_float": 1.5,
}


def test_decoded_by_real_tensorflow():
    import tensorflow as tf

    data = encode_example(FEATURES)
    ex = tf.train.Example.FromString(data)
    f = ex.features.feature
    assert f["image"].bytes_list.value == [bytes(range(256)) * 3 + b"\x00" * 16]
    assert list(f["label"].int64_list.value) == [7]
    assert list(f["neg"].int64_list.value) == [-1, 0, 1, -(2**63), 2**63 - 1, 300]
    np.testing.assert_array_equal(f["dense"].float_list.value, np.float32([0.5, -2.25, 1e30, 3.0]))
    assert list(f["words"].bytes_list.value) == ["héllo".encode(), b"world", b""]
    assert f["empty_f"].WhichOneof("kind") == "float_list"
    assert list(f["inferred_int"].int64_list.value) == [1, 2, 3]
    assert list(f["inferred_float"].float_list.value) == [1.5]
    # Same bytes as protobuf itself produces for the same message, and round trip of TF bytes.
    assert decode_example(ex.SerializeToString()) == decode_example(data)
    parsed = tf.io.parse_single_example(
        data,
        {
            "label": tf.io.FixedLenFeature([], tf.int64),
            "dense": tf.io.FixedLenFeature([4], tf.float32),
            "image": tf.io.FixedLenFeature([], tf.string),
        },
    )
    assert int(parsed["label"]) == 7


def test_decode_tf_written_unpacked():
    import tensorflow as tf

    ex = tf.train.Example()
    ex.features.feature["x"].float_list.value.extend([1.0, 2.0])
    ex.features.feature["y"].int64_list.value.extend([-5])
    ex.features.feature["z"].bytes_list.value.append(b"abc")
    got = decode_example(ex.SerializeToString())
    assert got == {
        "x": Feature("float", (1.0, 2.0)),
        "y": Feature("int64", (-5,)),
        "z": Feature("bytes", (b"abc",)),
    }


def test_round_trip_and_errors():
    vals = decode_example_values(encode_example(FEATURES))
    assert vals["neg"] == (-1, 0, 1, -(2**63), 2**63 - 1, 300)
    assert vals["words"] == ("héllo".encode(), b"world", b"")
    assert vals["empty_f"] == ()
    with pytest.raises(ExampleCodecError, match="feature 'o': cannot infer"):
        encode_example({"o": object()})
    with pytest.raises(ExampleCodecError, match="truncated|past the end"):
        decode_example(encode_example(FEATURES)[:-3])
    with pytest.raises(ExampleCodecError, match="needs integers"):
        int64_feature([1.5])
