import keras
import numpy as np
from elasticdl.worker.model_inputs import zeros_of_declared_inputs


def test_one_input_gives_one_tensor_of_one_example():
    x = keras.Input(shape=(28, 28), name="image")
    model = keras.Model(x, keras.layers.Dense(3)(keras.layers.Flatten()(x)))
    zeros = zeros_of_declared_inputs(model)
    assert zeros.shape == (1, 28, 28)
    assert not np.any(zeros.numpy())
    assert model(zeros).shape == (1, 3)


def test_named_inputs_keep_their_structure_and_unknown_dims_become_one():
    ids = keras.Input(shape=(None,), dtype="int64", name="ids")
    dense = keras.Input(shape=(4,), name="dense")
    out = keras.layers.Concatenate()(
        [keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(10, 2)(ids)), dense]
    )
    model = keras.Model({"ids": ids, "dense": dense}, out)
    zeros = zeros_of_declared_inputs(model)
    assert set(zeros) == {"ids", "dense"}
    assert zeros["ids"].shape == (1, 1) and zeros["ids"].dtype == "int64"
    assert zeros["dense"].shape == (1, 4)
    assert model(zeros).shape == (1, 6)


def test_a_subclassed_model_that_saw_no_data_declares_nothing():
    class Tiny(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, x):
            return self.dense(x)

    assert zeros_of_declared_inputs(Tiny()) is None
