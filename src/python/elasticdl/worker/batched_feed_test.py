"""A per-record feed made of maps, run over a whole vector of records, gives exactly what the
per-record pipeline then `batch` gives; anything else is refused with its reason."""
import numpy as np
import tensorflow as tf
from elasticdl.worker.batched_feed import BatchedFeed, map_chain, same_values

SPEC = {
    "dense": tf.io.FixedLenFeature([3], tf.float32),
    "ids": tf.io.FixedLenFeature([4], tf.int64),
    "label": tf.io.FixedLenFeature([1], tf.int64, default_value=[0]),
}


def _records(n):
    out = []
    for i in range(n):
        ex = tf.train.Example(
            features=tf.train.Features(
                feature={
                    "dense": tf.train.Feature(
                        float_list=tf.train.FloatList(value=[i * 0.5, -i, np.nan if i == 3 else 1])
                    ),
                    "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=[i, 2 * i, 7, i])),
                    # record 5 has no label: the default applies
                    **(
                        {}
                        if i == 5
                        else {
                            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2]))
                        }
                    ),
                }
            )
        )
        out.append(ex.SerializeToString())
    return out


def _parse(record):
    ex = tf.io.parse_single_example(record, SPEC)
    return {"dense": ex["dense"], "ids": ex["ids"]}, ex["label"]


def _scale(features, label):
    return {"dense": features["dense"] * 2.0, "ids": features["ids"] + 100}, tf.cast(
        label, tf.float32
    )


def test_a_chain_of_maps_over_a_vector_equals_per_record_then_batch():
    records = tf.data.Dataset.from_tensor_slices(_records(9))
    fed = records.map(_parse, num_parallel_calls=tf.data.AUTOTUNE).map(_scale)
    batched, why = BatchedFeed.of(fed, records)
    assert batched is not None, why
    want = fed.batch(9).get_single_element()
    got = batched(tf.constant(_records(9)))
    assert same_values(got, want)
    assert got[0]["ids"].numpy()[2].tolist() == [102, 104, 107, 102]
    assert got[1].numpy()[5].tolist() == [0.0]  # the parse's default
    assert np.isnan(got[0]["dense"].numpy()[3, 2])


def test_anything_but_maps_or_dense_values_is_refused_with_the_reason():
    records = tf.data.Dataset.from_tensor_slices(_records(4))
    parsed = records.map(_parse)
    for fed, reason in [
        (parsed.filter(lambda f, label: label[0] > 0), "FilterDataset"),
        (parsed.map(_scale).prefetch(1), "PrefetchDataset"),
        (records, "feed maps nothing"),
        (
            records.map(
                lambda r: tf.io.parse_single_example(r, {"v": tf.io.VarLenFeature(tf.int64)})
            ),
            "sparse or ragged",
        ),
    ]:
        chain, shuffles, why = map_chain(fed, records)
        assert chain is None and reason in why, why
    # a chain that starts from another dataset is not this feed's
    other = tf.data.Dataset.from_tensor_slices(_records(2))
    assert map_chain(other.map(_parse), records)[0] is None


def test_shuffles_among_the_maps_run_after_them_with_the_same_seeds():
    tf.random.set_seed(11)
    records = tf.data.Dataset.from_tensor_slices(_records(40))
    fed = records.map(_parse).shuffle(16).map(_scale).shuffle(8, reshuffle_each_iteration=False)
    batched, why = BatchedFeed.of(fed, records)
    assert batched is not None, why
    assert [(s.buffer_size.numpy(), s.reshuffle_each_iteration) for s in batched.shuffles] == [
        (16, True),
        (8, False),
    ]
    chunk = tf.data.Dataset.from_tensors(tf.constant(_records(40)))
    again = batched.shuffle(chunk.map(batched).unbatch()).batch(40).get_single_element()
    want = fed.batch(40).get_single_element()
    assert same_values(again, want)  # the same op seeds under one global seed: the same order
    labels = want[0]["ids"].numpy()[:, 0] - 100
    assert sorted(labels.tolist()) == list(range(40)) and labels.tolist() != list(range(40))


def test_same_values_compares_structure_dtype_shape_and_values():
    a = ({"x": tf.constant([1.0, np.nan])}, tf.constant([1]))
    assert same_values(a, ({"x": tf.constant([1.0, np.nan])}, tf.constant([1])))
    assert not same_values(a, ({"x": tf.constant([1.0, 2.0])}, tf.constant([1])))
    assert not same_values(a, ({"x": tf.constant([1.0, np.nan])}, tf.constant([1], tf.int64)))
    assert not same_values(a, ({"x": tf.constant([[1.0, np.nan]])}, tf.constant([1])))
    assert not same_values(a, ({"y": tf.constant([1.0, np.nan])}, tf.constant([1])))


def test_elementwise_string_ops_vectorize_to_the_per_record_values():
    def record(i):
        feature = {
            "image": tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[bytes(range(i, i + 6))])
            ),
            "text": tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[f" {i * 1.5} ".encode()])
            ),
            "b64": tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[tf.io.encode_base64(f"id{i}").numpy()])
            ),
        }
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    columns = {name: tf.io.FixedLenFeature([], tf.string) for name in ("image", "text", "b64")}

    def parse(r):
        ex = tf.io.parse_single_example(r, columns)
        pixels = tf.reshape(tf.io.decode_raw(ex["image"], tf.uint8), [2, 3])
        text = tf.strings.strip(ex["text"])
        value = tf.strings.to_number(text, tf.float32)
        bucket = tf.strings.to_hash_bucket_fast(tf.io.decode_base64(ex["b64"]), 97)
        return {"pixels": tf.cast(pixels, tf.float32) / 255.0, "value": value}, (
            bucket,
            tf.strings.as_string(value, precision=2),
        )

    records = tf.data.Dataset.from_tensor_slices([record(i) for i in range(12)])
    fed = records.map(parse)
    batched, why = BatchedFeed.of(fed, records)
    assert batched is not None, why
    # in a tf.data function, as the worker runs it (a tf.function's graph rewrites may round
    # the division by 255 differently: what the worker's check on real records is for)
    chunk = tf.data.Dataset.from_tensors(tf.constant([record(i) for i in range(12)]))
    got = chunk.map(batched).get_single_element()
    assert same_values(got, fed.batch(12).get_single_element())
    assert got[0]["pixels"].shape == (12, 2, 3) and got[1][1].numpy()[3] == b"4.50"
