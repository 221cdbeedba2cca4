"""A model's non-trainable state (BatchNormalization statistics) between the trainer and real
parameter servers (elasticdl.ps) over gRPC on 127.0.0.1: pushed with the model and with a task's
last push, sent alone when a task is stopped early (not when it fails), taken by a fresh worker,
never mixed up with the embedding layers' variables, and refused whole with the model when bad."""
import keras
import numpy as np
import pytest
import tensorflow as tf
from elasticdl.worker.layers import Embedding, find_embedding_layers
from elasticdl.worker.ps_client import PSClient
from elasticdl.worker.ps_trainer import PSTrainer, TrainerConfig, _state_variables
from elasticdl.worker.ps_trainer_test import _spec  # the same SGD(0.1) model spec


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


class StopAfter(keras.callbacks.Callback):
    """A user's EarlyStopping-like callback: stops training after `steps` minibatches."""

    def __init__(self, steps):
        super().__init__()
        self.steps, self.seen = steps, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen >= self.steps:
            self.reached()

    def reached(self):
        self.model.stop_training = True


class FailAfter(StopAfter):
    """A callback that raises after `steps` minibatches (the task fails)."""

    def reached(self):
        raise RuntimeError("the callback failed")


def _worker(cluster, callback, shared_memory=None):
    from elasticdl.worker.worker import Worker, WorkerConfig

    spec = _spec(_bn_model)
    spec.callbacks = lambda: [callback]
    trainer = PSTrainer(spec, PSClient(cluster.addrs, shared_memory=shared_memory))
    # The task's minibatches come ready (as a look-ahead prepares them): no master, no reader.
    worker = Worker(WorkerConfig(worker_id=0, prefetch_next_task=False), spec, None, trainer, None)
    return worker, trainer


def _task(batches):
    from elasticdl.proto import elasticdl_pb2 as pb

    return pb.Task(task_id=1, type=pb.TRAINING, shard=pb.Shard(name="f", start=0, end=32 * batches))


def _pulled_state(cluster):
    client = PSClient(cluster.addrs)
    try:
        return client.pull_dense_parameters(force=True, include_state=True).state
    finally:
        client.close()


@pytest.mark.parametrize(
    "stop, shared_memory",
    [("callback", True), ("callback", False), ("max_steps", True)],
    ids=["callback-shared-memory", "callback-messages", "max_steps-shared-memory"],
)
def test_a_task_stopped_early_delivers_the_statistics_it_trained(ps_cluster, stop, shared_memory):
    """Gradients pushed through shared memory and the local channel, or in messages: the
    state sent alone travels in its own message either way."""
    from elasticdl.common import shared_memory as shm
    from elasticdl.worker.callbacks import MaxStepsStopping

    if shared_memory and shm.default_directory() is None:
        pytest.skip("no /dev/shm here: pushes travel in messages only")
    cluster = ps_cluster(2)
    callback = StopAfter(3) if stop == "callback" else MaxStepsStopping(3)
    worker, trainer = _worker(cluster, callback, shared_memory)
    batches = [_data(seed) for seed in range(6)]
    result = worker.train_task(_task(6), batches)
    assert result["batches"] == 3  # stopped before the task's last minibatch
    assert trainer.ps.shared_memory_ps() == ([0, 1] if shared_memory else [])
    local = trainer.read_state()
    assert np.abs(local["bn/moving_mean"]).max() > 0.5  # really trained away from 0
    pulled = _pulled_state(cluster)
    assert pulled.keys() == local.keys()
    for name, value in pulled.items():
        np.testing.assert_array_equal(value, local[name])
    # Sent alone, the state moved no version: one per minibatch applied, on every PS.
    assert [s.params.version for s in cluster.servers] == [3, 3]
    trainer.ps.close()


def test_a_task_that_fails_sends_no_state_and_the_next_task_carries_it(ps_cluster):
    cluster = ps_cluster(1)
    worker, trainer = _worker(cluster, FailAfter(2))
    with pytest.raises(RuntimeError, match="the callback failed"):
        worker.train_task(_task(4), [_data(seed) for seed in range(4)])
    np.testing.assert_array_equal(_pulled_state(cluster)["bn/moving_mean"], np.zeros(8))
    worker.callbacks()[0].steps = 10**6  # the next task ends well, at its last minibatch
    worker.train_task(_task(2), [_data(seed) for seed in range(4, 6)])
    local = trainer.read_state()
    for name, value in _pulled_state(cluster).items():
        np.testing.assert_array_equal(value, local[name])
    assert cluster.servers[0].params.version == 4
    trainer.ps.close()


def test_push_model_with_bad_state_fails_the_worker_with_the_ps_line(ps_cluster):
    from elasticdl.worker.ps_trainer import PSRefusedModelError

    cluster = ps_cluster(1)
    trainer = PSTrainer(_spec(_bn_model), PSClient(cluster.addrs))
    x, _ = _data(0)
    model = _bn_model()
    model(x)
    model.get_layer("bn").moving_variance.assign(np.full(8, np.nan, np.float32))
    with pytest.raises(PSRefusedModelError) as refused:
        trainer.ensure_model(x, model=model)
    assert str(refused.value) == "state variable 'bn/moving_variance' holds NaN or infinity"
    assert not cluster.servers[0].params.initialized  # nothing taken
    trainer.ps.close()


def test_a_ps_without_push_state_leaves_the_state_to_the_next_tasks_last_push(
    ps_cluster, monkeypatch, caplog
):
    from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc
    from elasticdl.ps.servicer import PserverServicer

    # What a PS that predates push_state answers: the generated servicer's UNIMPLEMENTED.
    monkeypatch.setattr(PserverServicer, "push_state", pb_grpc.PserverServicer.push_state)
    cluster = ps_cluster(1)
    worker, trainer = _worker(cluster, StopAfter(2))
    result = worker.train_task(_task(4), [_data(seed) for seed in range(4)])
    assert result["batches"] == 2 and "predates push_state" in caplog.text
    np.testing.assert_array_equal(_pulled_state(cluster)["bn/moving_mean"], np.zeros(8))
    worker._stopped_training = trainer.model.stop_training = False
    worker.callbacks()[0].steps = 10**6
    worker.train_task(_task(2), [_data(seed) for seed in range(4, 6)])
    local = trainer.read_state()
    for name, value in _pulled_state(cluster).items():
        np.testing.assert_array_equal(value, local[name])
    assert cluster.servers[0].params.version == 4
    trainer.ps.close()
