"""The PS-backed Embedding: the original ElasticDL's Keras arguments (mask_zero, input_length)
and its ids as SparseTensor / ragged bags with combiners."""
import keras
import numpy as np
import pytest
import tensorflow as tf
from elasticdl.worker.layers import Embedding


class _MaskedSum(keras.layers.Layer):
    """Sums the vectors the mask keeps (like the original DeepFM file's ApplyMask)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def compute_mask(self, inputs, mask=None):
        return None

    def call(self, x, mask=None):
        return tf.reduce_sum(x * tf.cast(tf.expand_dims(mask, -1), x.dtype), axis=1)


def _table(dim):
    return np.arange(5 * dim, dtype=np.float32).reshape(5, dim)


def test_mask_zero_masks_padding_ids_for_the_next_layer():
    layer = Embedding(output_dim=2, mask_zero=True, input_length=3)
    ids = keras.Input(shape=(3,), dtype="int64")
    model = keras.Model(ids, _MaskedSum()(layer(ids)))
    layer.set_local_table(_table(2))
    out = model(np.array([[1, 0, 2], [0, 0, 4]]))
    np.testing.assert_array_equal(out.numpy(), [[2 + 4, 3 + 5], [8, 9]])
    np.testing.assert_array_equal(
        layer.compute_mask(np.array([[1, 0, 2]])).numpy(), [[True, False, True]]
    )
    config = layer.get_config()
    assert config["mask_zero"] is True and config["input_length"] == 3
    assert Embedding.from_config(config).mask_zero


def test_no_mask_by_default_or_with_a_combiner_and_input_length_fills_the_shape():
    assert Embedding(output_dim=2).compute_mask(np.array([[0, 1]])) is None
    assert (
        Embedding(output_dim=2, mask_zero=True, combiner="sum").compute_mask(np.array([[0, 1]]))
        is None
    )
    assert Embedding(output_dim=4, input_length=10).compute_output_shape((None, None)) == (
        None,
        10,
        4,
    )


# ---------------------------------------------------------------- SparseTensor / ragged ids
# The reference is TensorFlow's own bag lookup on the same table:
# tf.nn.safe_embedding_lookup_sparse with unit weights (empty bags give zeros).
COMBINER_NAMES = ["sum", "mean", "sqrtn"]


def _remote_layer(table, **kwargs):
    """A layer that looks its rows up through a lookup function (the trainer's PS path)."""
    layer = Embedding(output_dim=table.shape[1], **kwargs)
    looked_up = []

    def lookup(name, ids):
        looked_up.append(ids)
        return table[ids]

    layer.set_lookup_fn(lookup)
    return layer, looked_up


def _random_table(rows=20, dim=4):
    return np.random.default_rng(0).normal(size=(rows, dim)).astype(np.float32)


def _bags():
    # Row 1 is empty, row 2 repeats an id, row 3 has a single id.
    indices = [[0, 0], [0, 1], [0, 2], [2, 0], [2, 1], [2, 3], [3, 5]]
    values = [3, 7, 19, 5, 5, 0, 11]
    return tf.SparseTensor(indices, tf.constant(values, tf.int64), dense_shape=[4, 6])


def _reference(table, sparse_ids, combiner):
    return tf.nn.safe_embedding_lookup_sparse(
        tf.constant(table), sparse_ids, combiner=combiner
    ).numpy()


@pytest.mark.parametrize("combiner", COMBINER_NAMES)
def test_sparse_ids_combine_like_tensorflows_bag_lookup(combiner):
    table = _random_table()
    ids = _bags()
    expected = _reference(table, ids, combiner)
    assert np.all(expected[1] == 0)  # the empty bag
    layer, looked_up = _remote_layer(table, combiner=combiner)
    np.testing.assert_allclose(layer(ids).numpy(), expected, rtol=1e-6, atol=1e-6)
    # Each id is asked for once per batch.
    np.testing.assert_array_equal(np.sort(looked_up[-1]), [0, 3, 5, 7, 11, 19])
    local = Embedding(output_dim=4, combiner=combiner)
    local.set_local_table(table)  # the exported model's path
    np.testing.assert_allclose(local(ids).numpy(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("combiner", COMBINER_NAMES)
def test_sparse_ids_gradients_reach_the_looked_up_rows(combiner):
    # The gradient the worker pushes for each unique id must be the gradient of the same loss
    # with respect to that row of a table held by TensorFlow.
    table = _random_table()
    ids = _bags()
    weights = tf.constant(np.random.default_rng(1).normal(size=(4, 4)).astype(np.float32))
    layer, _ = _remote_layer(table, combiner=combiner)
    with tf.GradientTape() as tape:
        layer.set_tape(tape)
        loss = tf.reduce_sum(layer(ids) * weights)
    (record,) = layer.records
    grads = tf.convert_to_tensor(tape.gradient(loss, record.vectors)).numpy()  # as pushed

    variable = tf.Variable(table)
    with tf.GradientTape() as tape:
        ref_loss = tf.reduce_sum(
            tf.nn.safe_embedding_lookup_sparse(variable, ids, combiner=combiner) * weights
        )
    ref_grads = tf.convert_to_tensor(tape.gradient(ref_loss, variable)).numpy()
    np.testing.assert_allclose(loss.numpy(), ref_loss.numpy(), rtol=1e-5)
    np.testing.assert_allclose(grads, ref_grads[record.unique_ids.numpy()], rtol=1e-5, atol=1e-6)


def test_sparse_ids_of_rank_three_combine_along_the_last_axis():
    table = _random_table()
    ids = tf.SparseTensor(
        [[0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 1, 2]],
        tf.constant([1, 2, 3, 4], tf.int64),
        dense_shape=[2, 2, 3],
    )
    layer, _ = _remote_layer(table, combiner="mean")
    out = layer(ids).numpy()
    assert out.shape == (2, 2, 4)
    np.testing.assert_allclose(out, _reference(table, ids, "mean"), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("combiner", COMBINER_NAMES)
def test_ragged_ids_combine_like_the_same_bags_as_a_sparse_tensor(combiner):
    table = _random_table()
    ids = tf.ragged.constant([[3, 7, 19], [], [5, 5, 0], [11]], dtype=tf.int64)
    layer, _ = _remote_layer(table, combiner=combiner)
    out = layer(ids).numpy()
    np.testing.assert_allclose(
        out, _reference(table, ids.to_sparse(), combiner), rtol=1e-6, atol=1e-6
    )
    # Ragged of ragged: the innermost bags are combined, the outer ragged axis stays.
    nested = tf.RaggedTensor.from_row_lengths(ids, [3, 1])
    out2 = layer(nested)
    assert isinstance(out2, tf.RaggedTensor)
    np.testing.assert_allclose(out2.flat_values.numpy(), out, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out2.row_lengths().numpy(), [3, 1])


def test_ragged_ids_without_a_combiner_give_ragged_vectors():
    table = _random_table()
    ids = tf.ragged.constant([[3, 7], [], [5]], dtype=tf.int64)
    layer, _ = _remote_layer(table)
    out = layer(ids)
    assert isinstance(out, tf.RaggedTensor)
    np.testing.assert_array_equal(out.row_lengths().numpy(), [2, 0, 1])
    np.testing.assert_allclose(out.flat_values.numpy(), table[[3, 7, 5]])


def test_sparse_ids_need_a_combiner_and_no_mask_zero():
    with pytest.raises(ValueError, match="needs a combiner"):
        Embedding(output_dim=2)(_bags())
    with pytest.raises(ValueError, match="mask_zero does not apply"):
        Embedding(output_dim=2, combiner="sum", mask_zero=True)(_bags())


def test_functional_model_with_a_sparse_input():
    table = _random_table()
    ids = keras.Input(shape=(None,), sparse=True, dtype="int64", name="ids")
    layer = Embedding(output_dim=4, combiner="sqrtn")
    model = keras.Model(ids, keras.layers.Dense(1, use_bias=False)(layer(ids)))
    layer.set_local_table(table)
    kernel = model.layers[-1].kernel.numpy()
    np.testing.assert_allclose(
        model(_bags()).numpy(),
        _reference(table, _bags(), "sqrtn") @ kernel,
        rtol=1e-5,
        atol=1e-6,  # a random kernel can sum a row to about 0, where float32 has no relative digits
    )


# ---------------------------------------------------------------- lookups shared by layers
def _two_tables_on_the_same_ids():
    ids = keras.Input(shape=(3,), dtype="int64")
    vectors = Embedding(2, name="vectors")(ids)
    weights = Embedding(1, name="weights")(ids)
    other = Embedding(2, name="other")(ids + 1)  # other ids: its own pull
    out = keras.layers.Concatenate()(
        [keras.layers.Flatten()(vectors), keras.layers.Flatten()(weights)]
    )
    return keras.Model(ids, [out, keras.layers.Flatten()(other)])


def _shared(tables):
    from elasticdl.worker.layers import SharedLookups, find_embedding_layers

    calls = []

    def lookup_many(wanted, unique):
        calls.append(sorted(name for name, _ in wanted))
        return [tables[name][unique] for name, _ in wanted]

    model = _two_tables_on_the_same_ids()
    shared = SharedLookups(lookup_many)
    for layer in find_embedding_layers(model):
        layer.set_lookup_fn(lambda name, unique: lookup_many([(name, 0)], unique)[0])
        layer.set_shared_lookups(shared)
    return model, shared, calls


@pytest.mark.parametrize("traced", [True, False])
def test_layers_on_the_same_ids_pull_together_when_traced(traced):
    tables = {"vectors": _table(2), "weights": _table(1), "other": _table(2) + 100}
    model, shared, calls = _shared(tables)
    ids = np.array([[1, 2, 2], [3, 0, 1]])

    def forward(x):
        shared.reset()
        return model(x)

    run = tf.function(forward) if traced else forward
    for _ in range(2):
        calls.clear()
        out, other = run(tf.constant(ids))
        np.testing.assert_array_equal(
            out.numpy(),
            np.concatenate(
                [tables["vectors"][ids].reshape(2, -1), tables["weights"][ids].reshape(2, -1)], 1
            ),
        )
        np.testing.assert_array_equal(other.numpy(), tables["other"][ids + 1].reshape(2, -1))
        if traced:  # one pull for both layers on `ids`, one for the layer on `ids + 1`
            assert sorted(calls) == [["other"], ["vectors", "weights"]]
        else:  # eagerly the first pull runs before the second layer joins: each its own
            assert sorted(calls) == [["other"], ["vectors"], ["weights"]]
