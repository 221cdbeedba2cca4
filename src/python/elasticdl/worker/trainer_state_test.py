"""A model's non-trainable state (BatchNormalization statistics) between the trainer and real
parameter servers (elasticdl.ps) over gRPC on 127.0.0.1: pushed with the model and with a task's
last push, taken by a fresh worker, and never mixed up with the embedding layers' variables."""
import keras
import numpy as np
import tensorflow as tf
from elasticdl.worker.layers import Embedding, find_embedding_layers
from elasticdl.worker.ps_client import PSClient
from elasticdl.worker.trainer import PSTrainer, TrainerConfig, _state_variables
from elasticdl.worker.trainer_test import _spec  # the same SGD(0.1) model spec


def _bn_model():
    inp = keras.Input(shape=(4,))
    h = keras.layers.Dense(8, name="hidden")(inp)
    h = keras.layers.BatchNormalization(momentum=0.5, name="bn")(h)
    h = keras.layers.Dropout(0.1, name="drop")(h)  # Keras 3: an integer seed variable
    return keras.Model(inp, keras.layers.Dense(3, name="out")(h))


def _data(seed):
    rng = np.random.default_rng(seed)
    # Far from mean 0 / variance 1, so trained statistics differ clearly from the initial ones.
    x = rng.normal(loc=3.0, scale=2.0, size=(32, 4)).astype(np.float32)
    return tf.constant(x), tf.constant(rng.integers(0, 3, size=32))


def _ps_state(cluster):
    held = {}
    for server in cluster.servers:
        held.update(server.params.state)
    return held


def test_state_travels_with_the_model_and_a_tasks_last_push(ps_cluster):
    cluster = ps_cluster(2)
    client = PSClient(cluster.addrs)
    trainer = PSTrainer(_spec(_bn_model), client)
    x, y = _data(0)
    trainer.ensure_model(x)
    names = {"bn/moving_mean", "bn/moving_variance"}
    assert set(trainer.read_state()) == names  # not the Dropout seed, not trainable weights
    held = _ps_state(cluster)
    assert held.keys() == names  # the initial push, each variable on its own PS
    np.testing.assert_array_equal(held["bn/moving_variance"], np.ones(8))
    for server in cluster.servers:
        assert not set(server.params.state) & set(server.params.dense)

    trainer.train_minibatch(x, y)  # not a task's last minibatch: the PS keeps what it had
    np.testing.assert_array_equal(_ps_state(cluster)["bn/moving_mean"], np.zeros(8))
    trainer.train_minibatch(*_data(1), send_state=True)
    local = trainer.read_state()
    assert np.abs(local["bn/moving_mean"]).max() > 0.5  # really trained away from 0
    for name, value in _ps_state(cluster).items():
        np.testing.assert_array_equal(value, local[name])

    # A relaunched worker (or an evaluation job's) starts from the PS's statistics, not from
    # its model's initial ones, and so computes the same outputs.
    fresh = PSTrainer(_spec(_bn_model), PSClient(cluster.addrs), TrainerConfig())
    fresh.ensure_model(x)
    for name, value in fresh.read_state().items():
        np.testing.assert_array_equal(value, local[name])
    np.testing.assert_allclose(fresh.forward(x).numpy(), trainer.forward(x).numpy(), rtol=1e-5)
    client.close()
    fresh.ps.close()


def test_embedding_layer_variables_are_not_state():
    inp = keras.Input(shape=(3,), dtype="int64")
    emb = Embedding(4, input_dim=10, combiner="mean", name="emb")(inp)
    out = keras.layers.BatchNormalization(name="bn")(emb)
    model = keras.Model(inp, keras.layers.Dense(2, name="out")(out))
    layers = find_embedding_layers(model)
    layers[0].set_local_table(np.zeros((10, 4), np.float32))  # what an export creates
    assert layers[0].local_table in model.non_trainable_variables
    paths = sorted(v.path for v in _state_variables(model, layers))
    assert paths == ["bn/moving_mean", "bn/moving_variance"]
