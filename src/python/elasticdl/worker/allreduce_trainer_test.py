"""The state a forming group broadcasts, for either Keras: tf.keras (Keras 2) variables have a
``tf.DType``, Keras 3's a dtype name. A member whose state sync failed leaves the group instead
of training in it with a replica of its own."""
import keras
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from elasticdl.worker.allreduce_trainer import AllreduceTrainer, numpy_dtype


@pytest.mark.parametrize(
    "variable, expected",
    [
        (tf.Variable(np.zeros(2, np.float32)), np.float32),  # what tf.keras layers create
        (tf.Variable(np.zeros(2, np.float64)), np.float64),
        (tf.Variable(tf.zeros([2], tf.bfloat16)), ml_dtypes.bfloat16),
        (keras.Variable(np.zeros(2, np.float32)), np.float32),
        (keras.Variable(np.zeros(2, np.int64), trainable=False), np.int64),  # optimizer step
    ],
)
def test_numpy_dtype_of_either_kerass_variables(variable, expected):
    assert numpy_dtype(variable) == np.dtype(expected)


class _Group:
    """The parts of a CommGroup that joining touches, for a rank-1 member of two."""

    def __init__(self):
        self.is_member = False
        self.rank, self.world_size = -1, 0
        self.dropped = []

    def join(self):
        self.is_member, self.rank, self.world_size = True, 1, 2

    def drop(self, failed):
        self.is_member, self.rank, self.world_size = False, -1, 0
        self.dropped.append(failed)

    def broadcast_(self, buf, root):
        raise ValueError("a broken broadcast")

    def acknowledge(self):
        raise AssertionError("a member whose state was not synced acknowledged the group")


def test_a_member_whose_state_sync_fails_leaves_the_group():
    group = _Group()
    trainer = AllreduceTrainer(spec=None, group=group, master=None)
    trainer.model, trainer.optimizer = _tiny_model_and_optimizer()
    with pytest.raises(ValueError, match="a broken broadcast"):
        trainer._ensure_member()
    assert not group.is_member and group.dropped == [True]


def _tiny_model_and_optimizer():
    inp = keras.Input(shape=(2,))
    model = keras.Model(inp, keras.layers.Dense(1)(inp))
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    return model, optimizer
