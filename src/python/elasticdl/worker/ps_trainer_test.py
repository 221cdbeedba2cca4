"""Trainer against real parameter servers (elasticdl.ps) over gRPC on 127.0.0.1."""
import keras
import numpy as np
import pytest
import tensorflow as tf
from elasticdl.common import push_wire
from elasticdl.common.model_utils import ModelSpec
from elasticdl.worker import ps_client
from elasticdl.worker.layers import Embedding
from elasticdl.worker.ps_client import PSClient
from elasticdl.worker.ps_trainer import (
    PSRefusedModelError,
    PSTrainer,
    PushRejectedError,
    TrainerConfig,
    WorkerStuckError,
)
from elasticdl.worker.ps_types import PackedLayout, message_layout

LR = 0.1


def _loss(labels, outputs):
    return keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True)


def _spec(model_fn):
    return ModelSpec(
        module=None,
        model_fn=model_fn,
        loss=_loss,
        optimizer=lambda: keras.optimizers.SGD(LR),
        feed=None,
        eval_metrics_fn=None,
    )


def _dense_model():
    inp = keras.Input(shape=(4,))
    h = keras.layers.Dense(8, activation="relu")(inp)
    return keras.Model(inp, keras.layers.Dense(3)(h))


def _data(n=16, seed=0):
    rng = np.random.default_rng(seed)
    return (
        tf.constant(rng.normal(size=(n, 4)).astype(np.float32)),
        tf.constant(rng.integers(0, 3, size=n)),
    )


@pytest.mark.parametrize("use_tf_function", [True, False])
def test_one_step_through_ps_equals_local_keras_sgd(ps_cluster, use_tf_function):
    cluster = ps_cluster(2)
    client = PSClient(cluster.addrs)
    trainer = PSTrainer(_spec(_dense_model), client, TrainerConfig(use_tf_function=use_tf_function))
    x, y = _data()
    trainer.ensure_model(x)
    initial = [v.numpy() for v in trainer.model.trainable_variables]

    local = _dense_model()
    for v, w in zip(local.trainable_variables, initial):
        v.assign(w)
    opt = keras.optimizers.SGD(LR)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(_loss(y, local(x, training=True)))
    opt.apply_gradients(
        zip(tape.gradient(loss, local.trainable_variables), local.trainable_variables)
    )

    got_loss = trainer.train_minibatch(x, y)
    assert got_loss == pytest.approx(float(loss), rel=1e-5)
    # The updated parameters came back with the push: no pull needed to see them. The compiled
    # step assigns them in its next call; whatever reads the model first flushes them.
    assert (trainer._pending is not None) == use_tf_function
    trainer.flush_pending_assign()
    for v, ref in zip(trainer.model.trainable_variables, local.trainable_variables):
        np.testing.assert_allclose(v.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    assert trainer.steps == 1 and trainer.model_version == 1
    client.close()


class _CountingClient(PSClient):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = {"pull": 0, "push": 0, "push_with_pull": 0}

    def pull_dense_parameters(self, force=False, **kwargs):
        self.calls["pull"] += 1
        return super().pull_dense_parameters(force, **kwargs)

    def push_gradients(self, dense, emb=None, learning_rate=0.0, pull_dense=False, **kwargs):
        self.calls["push_with_pull" if pull_dense else "push"] += 1
        return super().push_gradients(dense, emb, learning_rate, pull_dense, **kwargs)


@pytest.mark.parametrize("use_async", [False, True])
def test_one_round_trip_per_minibatch_and_the_replica_tracks_the_ps(ps_cluster, use_async):
    cluster = ps_cluster(2, use_async=use_async)
    client = _CountingClient(cluster.addrs)
    trainer = PSTrainer(_spec(_dense_model), client)
    for step in range(5):
        trainer.train_minibatch(*_data(seed=step))
    assert client.calls == {"pull": 1, "push": 0, "push_with_pull": 5}  # the pull: start-up
    ps_params = {}
    for server in cluster.servers:
        ps_params.update(server.params.dense)
    # Through shared memory the last push's parameters wait for the next step's compiled call;
    # whatever reads the model in between flushes them first.
    assert client.packed_layout() is not None and trainer._pending is not None
    trainer.flush_pending_assign()
    for name, var in zip(trainer._names, trainer._vars):
        np.testing.assert_array_equal(var.numpy(), ps_params[name])
    assert trainer.model_version == 5
    client.close()


def test_get_model_steps_pulls_with_every_nth_push(ps_cluster):
    cluster = ps_cluster(1)
    client = _CountingClient(cluster.addrs)
    trainer = PSTrainer(_spec(_dense_model), client, TrainerConfig(get_model_steps=3))
    for step in range(7):
        trainer.train_minibatch(*_data(seed=step))
    # Steps 3 and 6 ask for the parameters with their push (before: a pull before steps 4, 7).
    assert client.calls == {"pull": 1, "push": 5, "push_with_pull": 2}
    client.close()


def _embedding_model(remote=True):
    inp = keras.Input(shape=(3,), dtype="int64")
    if remote:
        emb = Embedding(4, input_dim=10, combiner="mean", name="emb")(inp)
    else:
        emb = keras.ops.mean(keras.layers.Embedding(10, 4, name="emb")(inp), axis=1)
    return keras.Model(inp, keras.layers.Dense(3, name="out")(emb))


def _step_both_and_compare_tables(trainer, client, local, x, y):
    """One SGD step of `trainer` (table "emb" on the PS) and of the all-Keras `local` model
    from the same weights: the same loss, and the same table after it."""
    trainer.ensure_model(x)
    table = client.pull_embedding_vectors("emb", np.arange(10))
    dense_init = [v.numpy() for v in trainer.model.trainable_variables]
    local.get_layer("emb").embeddings.assign(table)
    local.get_layer("out").kernel.assign(dense_init[0])
    local.get_layer("out").bias.assign(dense_init[1])
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(_loss(y, local(x, training=True)))
    grads = tape.gradient(loss, local.trainable_variables)
    keras.optimizers.SGD(LR).apply_gradients(zip(grads, local.trainable_variables))

    assert trainer.train_minibatch(x, y) == pytest.approx(float(loss), rel=1e-5)
    np.testing.assert_allclose(
        client.pull_embedding_vectors("emb", np.arange(10)),
        local.get_layer("emb").embeddings.numpy(),
        rtol=1e-5,
        atol=1e-6,
    )


def test_embedding_step_matches_local_keras_embedding(ps_cluster):
    cluster = ps_cluster(2)
    client = PSClient(cluster.addrs)
    trainer = PSTrainer(_spec(_embedding_model), client)
    x = tf.constant([[1, 2, 2], [3, 1, 7], [7, 7, 7]], tf.int64)
    y = tf.constant([0, 1, 2])
    local = _embedding_model(remote=False)
    _step_both_and_compare_tables(trainer, client, local, x, y)
    trainer.pull_model()
    np.testing.assert_allclose(
        trainer.model.get_layer("out").kernel.numpy(),
        local.get_layer("out").kernel.numpy(),
        rtol=1e-5,
        atol=1e-6,
    )
    client.close()


def _embedding_called(times: int, remote: bool):
    """One table looked up `times` times per example (overlapping id columns)."""
    inp = keras.Input(shape=(4,), dtype="int64")
    if remote:
        layer = Embedding(4, input_dim=10, combiner="mean", name="emb")
        looked_up = [layer(inp[:, k : k + 2]) for k in range(times)]
    else:
        layer = keras.layers.Embedding(10, 4, name="emb")
        looked_up = [keras.ops.mean(layer(inp[:, k : k + 2]), axis=1) for k in range(times)]
    joined = looked_up[0] if times == 1 else keras.layers.Concatenate()(looked_up)
    return keras.Model(inp, keras.layers.Dense(3, name="out")(joined))


@pytest.mark.parametrize("times", [1, 2])
def test_a_layer_called_once_pushes_its_unique_ids_unsorted(ps_cluster, monkeypatch, times):
    """A layer's rows for its `tf.unique` ids go to the PS as they are (first appearance, not
    sorted; the PS ranks them); a table looked up twice is summed per id first. Both train
    exactly as Keras does."""
    from elasticdl.worker import ps_client

    summed = []
    real = ps_client.deduplicate_indexed_rows
    monkeypatch.setattr(
        ps_client, "deduplicate_indexed_rows", lambda v, i: summed.append(i.size) or real(v, i)
    )
    cluster = ps_cluster(2)
    client = PSClient(cluster.addrs)
    trainer = PSTrainer(_spec(lambda: _embedding_called(times, remote=True)), client)
    # First appearance 9, 4, 2, 7, 3, 1, 0: decreasing and spread over both PS.
    x = tf.constant([[9, 4, 4, 2], [7, 3, 9, 1], [0, 2, 7, 7]], tf.int64)
    y = tf.constant([0, 1, 2])
    _step_both_and_compare_tables(trainer, client, _embedding_called(times, remote=False), x, y)
    # Once: nothing summed on the worker. Twice: the calls' 6 and 5 unique ids, concatenated.
    assert summed == {1: [], 2: [11]}[times], summed
    client.close()


def test_tables_that_cannot_fit_on_the_ps_fail_before_any_training(ps_cluster):
    """The layers' vocabularies reach the PS with the tables; a table whose share of rows
    cannot fit in the PS's memory (here 10^13 rows: no machine has 1,000 TiB) is refused with
    one line before the PS holds any table, model or row, and a table that fits then trains."""
    cluster = ps_cluster(2, opt_type="Adam")
    client = PSClient(cluster.addrs)

    def huge_model():
        inp = keras.Input(shape=(3,), dtype="int64")
        emb = Embedding(16, input_dim=10**13, combiner="mean", name="huge")(inp)
        return keras.Model(inp, keras.layers.Dense(3, name="out")(emb))

    x = tf.constant([[1, 2, 2], [3, 1, 7], [7, 7, 7]], tf.int64)
    y = tf.constant([0, 1, 2])
    trainer = PSTrainer(_spec(huge_model), client)
    with pytest.raises(PSRefusedModelError) as refused:
        trainer.train_minibatch(x, y)
    msg = str(refused.value)
    assert msg.startswith(
        "embedding table 'huge' (vocabulary 10,000,000,000,000, dim 16: 5,000,000,000,000 rows "
        "x 222 B on each PS) needs "
    ), msg
    assert "GiB on each of 2 PS" in msg and "--num_ps_pods" in msg and "\n" not in msg
    for server in cluster.servers:
        assert not server.params.embedding_tables and not server.params.initialized
        assert server.params.version == 0

    trainer = PSTrainer(_spec(_embedding_model), client)  # input_dim 10: fits anywhere
    trainer.train_minibatch(x, y)
    assert [s.params.version for s in cluster.servers] == [1, 1]
    assert sum(len(s.params.embedding_tables["emb"]) for s in cluster.servers) == 4  # 1, 2, 3, 7
    client.close()


def test_restarted_ps_gets_the_model_again(ps_cluster):
    cluster = ps_cluster(1)
    client = PSClient(cluster.addrs)
    trainer = PSTrainer(_spec(_dense_model), client)
    x, y = _data()
    trainer.train_minibatch(x, y)
    # Simulate a PS that lost its state: a fresh cluster on the same client address list.
    fresh = ps_cluster(1)
    client2 = PSClient(fresh.addrs)
    trainer.ps = client2
    trainer._need_pull = True
    trainer.train_minibatch(x, y)
    assert fresh.servers[0].params.version == 1
    client.close()
    client2.close()


def test_rejected_gradients_fail_with_clear_error(ps_cluster):
    # Sync PS with zero tolerance and two gradients needed: a worker whose version is behind
    # is rejected every time; here we force that by pinning the client's versions stale.
    cluster = ps_cluster(1, use_async=False, grads_to_wait=1)
    client = PSClient(cluster.addrs)
    trainer = PSTrainer(
        _spec(_dense_model), client, TrainerConfig(max_minibatch_retries=3, get_model_steps=10**9)
    )
    x, y = _data()
    trainer.train_minibatch(x, y)
    trainer.train_minibatch(x, y)  # PS version now 2
    trainer.pull_model = lambda force=False: client.ps_versions.__setitem__(0, 0)
    with pytest.raises(WorkerStuckError, match="rejected"):
        trainer.train_minibatch(x, y)
    client.close()


def test_export_saved_model_with_embeddings(ps_cluster, tmp_path):
    cluster = ps_cluster(2)
    client = PSClient(cluster.addrs)
    trainer = PSTrainer(_spec(_embedding_model), client)
    x = tf.constant([[1, 2, 2], [3, 1, 7]], tf.int64)
    trainer.train_minibatch(x, tf.constant([0, 1]))
    trainer.pull_model()
    expected = trainer.forward(x).numpy()
    trainer.export_saved_model(str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    np.testing.assert_allclose(loaded.serve(x).numpy(), expected, rtol=1e-5, atol=1e-6)
    client.close()


class WithUnusedLayer(keras.Model):
    def __init__(self):
        super().__init__(name="with_unused")
        self.used = keras.layers.Dense(3, name="used")
        self.unused = keras.layers.Dense(2, name="unused")

    def build(self, input_shape):
        self.used.build(input_shape)
        self.unused.build(input_shape)

    def call(self, x):
        return self.used(x)


def test_packed_step_falls_back_when_a_variable_gets_no_gradient(ps_cluster):
    cluster = ps_cluster(1, use_async=False)
    client = PSClient(cluster.addrs)
    trainer = PSTrainer(_spec(WithUnusedLayer), client)
    for step in range(4):
        trainer.train_minibatch(*_data(seed=step))
    assert client.packed_layout() is not None  # the packed path was offered ...
    assert trainer._packed_ok is False  # ... and left: the PS must not get zeros for "unused"
    trainer.flush_pending_assign()
    held = cluster.servers[0].params.dense
    for name, var in zip(trainer._names, trainer._vars):
        np.testing.assert_array_equal(var.numpy(), held[name])
    unused = [n for n in trainer._names if "unused" in n]
    assert unused and cluster.servers[0].params.version == 4
    client.close()


def test_reading_the_model_applies_parameters_a_push_brought_back(ps_cluster):
    cluster = ps_cluster(1)
    client = PSClient(cluster.addrs)
    trainer = PSTrainer(_spec(_dense_model), client)
    for step in range(3):
        trainer.train_minibatch(*_data(seed=step))
    assert trainer._pending is not None
    x, _ = _data(seed=9)
    out = trainer.forward(x).numpy()  # flushes first
    assert trainer._pending is None
    reference = _dense_model()
    reference(x)
    held = cluster.servers[0].params.dense
    for v, name in zip(reference.trainable_variables, trainer._names):
        v.assign(held[name])
    np.testing.assert_allclose(out, reference(x).numpy(), rtol=1e-5, atol=1e-6)
    client.close()


def test_parameter_names_of_keras3_and_tf_variables():
    # tf.keras 2 models (tf-keras) hold tf.Variables: named by `name` without ":0".
    from elasticdl.worker.ps_trainer import _param_names

    layer = keras.layers.Dense(1, name="d")
    layer.build((None, 2))
    assert _param_names(layer.trainable_variables) == ["d/kernel", "d/bias"]
    with tf.name_scope("dense_features"):
        v = tf.Variable([1.0], name="age_embedding")
    assert _param_names([v]) == ["dense_features/age_embedding"]


def test_overlapped_pushes_run_each_step_one_push_behind_and_wait_settles_them(ps_cluster):
    cluster = ps_cluster(1, use_async=True)
    client = PSClient(cluster.addrs)
    overlapped = PSTrainer(_spec(_dense_model), client, TrainerConfig(overlap_pushes=True))
    x, y = _data()
    server = cluster.servers[0]
    losses = []
    aligned = []
    for step in range(1, 5):
        losses.append(overlapped.train_minibatch(x, y))
        # At most one push in flight: the previous one was answered before this one was sent.
        assert server.params.version >= step - 1
        if overlapped._pending is not None:
            aligned += [b.ctypes.data % 64 == 0 for b in overlapped._pending.blocks.values()]
    # The second step ran while the first push was in flight: on the same parameters.
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)
    assert losses[2] < losses[1]  # the third had the first push's answer
    overlapped.wait_for_pushes()
    assert server.params.version == 4 and overlapped.steps == 4
    assert overlapped.model_version == 4
    # The answers' parameters came in the region shared with the PS, which the next push
    # overwrites before the step after it reads them: each step held aligned copies of its own.
    assert client.shared_memory_ps() == [0]
    region = client._links[0].shared.region.packed().parameters
    pending = overlapped._pending.blocks[0]
    aligned.append(pending.ctypes.data % 64 == 0)
    assert len(aligned) >= 3 and all(aligned) and not np.shares_memory(pending, region)
    np.testing.assert_array_equal(pending, region)
    overlapped.flush_pending_assign()
    for name, var in zip(overlapped._names, overlapped._vars):
        np.testing.assert_array_equal(var.numpy(), server.params.dense[name])
    client.close()


def test_sync_mode_steps_on_the_parameters_of_the_previous_push(ps_cluster):
    cluster = ps_cluster(1, use_async=False)
    client = PSClient(cluster.addrs)
    trainer = PSTrainer(_spec(_dense_model), client)
    x, y = _data()
    first, second = trainer.train_minibatch(x, y), trainer.train_minibatch(x, y)
    assert second < first and cluster.servers[0].params.version == 2
    trainer.wait_for_pushes()  # nothing in flight: a no-op
    client.close()


class _FailingPushClient(PSClient):
    def __init__(self, *args, fail_at=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_at, self.pushes = set(fail_at), 0

    def push_gradients(self, *args, **kwargs):
        self.pushes += 1
        if self.pushes in self.fail_at:
            raise RuntimeError(f"push {self.pushes} failed")
        return super().push_gradients(*args, **kwargs)


def test_an_overlapped_push_that_fails_raises_once_from_the_next_wait(ps_cluster):
    cluster = ps_cluster(1, use_async=True)
    client = _FailingPushClient(cluster.addrs, fail_at={2, 4})
    trainer = PSTrainer(_spec(_dense_model), client, TrainerConfig(overlap_pushes=True))
    x, y = _data()
    trainer.train_minibatch(x, y)
    trainer.train_minibatch(x, y)  # its push fails in the background
    with pytest.raises(RuntimeError, match="push 2 failed"):
        trainer.wait_for_pushes()
    trainer.wait_for_pushes()  # raised once: the next task does not inherit it
    assert trainer.steps == 1
    trainer.train_minibatch(x, y)
    trainer.train_minibatch(x, y)  # push 4 fails in the background ...
    with pytest.raises(RuntimeError, match="push 4 failed"):
        trainer.train_minibatch(x, y)  # ... and the next step, which waits for it, raises
    assert trainer.steps == 2 and cluster.servers[0].params.version == 2
    client.close()


def test_an_overlapped_push_a_ps_rejects_fails_and_offers_the_model_again(ps_cluster):
    cluster = ps_cluster(1, use_async=True)
    client = PSClient(cluster.addrs)
    trainer = PSTrainer(_spec(_dense_model), client, TrainerConfig(overlap_pushes=True))
    x, y = _data()
    trainer.train_minibatch(x, y)
    trainer.wait_for_pushes()
    fresh = ps_cluster(1, use_async=True)  # a PS that lost its model (relaunched)
    client2 = PSClient(fresh.addrs)
    trainer.ps = client2
    trainer.train_minibatch(x, y)
    with pytest.raises(PushRejectedError, match="runs again"):
        trainer.wait_for_pushes()
    trainer.train_minibatch(x, y)  # pulls first, finds no model and pushes it
    trainer.wait_for_pushes()
    assert fresh.servers[0].params.version == 1 and fresh.servers[0].params.initialized
    client.close()
    client2.close()


def _vectors_and_weights_model():
    # As DeepFM: two tables looked up with the same ids.
    ids = keras.Input(shape=(3,), dtype="int64")
    vectors = Embedding(4, input_dim=50, embeddings_initializer="ones", name="vectors")(ids)
    weights = Embedding(1, input_dim=50, embeddings_initializer="ones", name="weights")(ids)
    x = keras.layers.Concatenate()(
        [keras.layers.Flatten()(vectors), keras.layers.Flatten()(weights)]
    )
    return keras.Model(ids, keras.layers.Dense(3, name="out")(x))


class _CountingPulls(PSClient):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pulls = []

    def pull_rows_of_tables(self, tables, ids, ids_unique=False):
        self.pulls.append(sorted(name for name, _ in tables))
        return super().pull_rows_of_tables(tables, ids, ids_unique)


def test_layers_on_the_same_ids_pull_in_one_call_and_train_as_apart(ps_cluster):
    rng = np.random.default_rng(5)
    batches = [
        (tf.constant(rng.integers(0, 50, (8, 3))), tf.constant(rng.integers(0, 3, 8)))
        for _ in range(3)
    ]
    held = []
    for share in (True, False):
        cluster = ps_cluster(1, use_async=False)
        client = _CountingPulls(cluster.addrs)
        trainer = PSTrainer(_spec(_vectors_and_weights_model), client)
        keras.utils.set_random_seed(7)  # the same dense model both times
        trainer.ensure_model(batches[0][0])
        if not share:
            for layer in trainer.embedding_layers:
                layer.set_shared_lookups(None)
        client.pulls.clear()
        for x, y in batches:
            trainer.train_minibatch(x, y)
        if share:  # one pull per step for both tables
            assert client.pulls == [["vectors", "weights"]] * 3
        else:
            assert sorted(client.pulls) == [["vectors"]] * 3 + [["weights"]] * 3
        ids = np.arange(50)
        held.append([client.pull_embedding_vectors(n, ids) for n in ("vectors", "weights")])
        client.close()
    for a, b in zip(*held):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("ps_packs", [True, False], ids=["ps_packs", "ps_sends_tensors"])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "grpc"])
def test_dense_tensors_in_messages_take_the_packed_step(ps_cluster, monkeypatch, stream, ps_packs):
    # A worker on another host than its PS (no shared memory), by its stream channel or by
    # gRPC: each push's answer brings the parameters as one aligned block per PS that the next
    # step assigns in its own compiled call, and it trains as Keras does. The stream channel
    # reads the answer into an aligned buffer, so its block is used as it came; gRPC's bytes
    # may start anywhere, and are copied once. A PS that sends the parameters tensor by tensor
    # (one that predates packed answers) has them packed into blocks by the worker.
    if not ps_packs:
        monkeypatch.setattr(push_wire, "_packable_digest", lambda params: b"")
    packs = []
    monkeypatch.setattr(
        PackedLayout,
        "pack",
        lambda self, params, pack=PackedLayout.pack: packs.append(1) or pack(self, params),
    )
    copies = []
    monkeypatch.setattr(
        ps_client,
        "aligned_copy",
        lambda *a, fn=ps_client.aligned_copy: copies.append(1) or fn(*a),
    )
    cluster = ps_cluster(2, use_async=False)
    client = PSClient(cluster.addrs, shared_memory=False, stream_channel=stream)
    trainer = PSTrainer(_spec(_dense_model), client)
    x, y = _data()
    trainer.ensure_model(x)
    local = _dense_model()
    for v, w in zip(local.trainable_variables, trainer.model.trainable_variables):
        v.assign(w.numpy())
    opt = keras.optimizers.SGD(LR)
    assigns = []
    assign = trainer._assign
    trainer._assign = lambda params: assigns.append(sorted(params)) or assign(params)
    for step in range(4):
        x, y = _data(seed=step)
        with tf.GradientTape() as tape:
            want = tf.reduce_mean(_loss(y, local(x, training=True)))
        grads = tape.gradient(want, local.trainable_variables)
        opt.apply_gradients(zip(grads, local.trainable_variables))
        assert trainer.train_minibatch(x, y) == pytest.approx(float(want), rel=1e-5)
        pending = trainer._pending
        holders = [ps_id for ps_id, _ in client.packed_layout().entries]  # PS holding tensors
        assert pending is not None and holders and sorted(pending.blocks) == holders
        assert all(block.ctypes.data % 64 == 0 for block in pending.blocks.values())
    assert assigns == []  # every answer went to the next step's call, none assigned apart
    if ps_packs:
        assert packs == []  # the blocks came as they are
        if stream:
            assert copies == []  # and were used where they were received
    else:
        assert len(packs) == 4
    assert client.packed_layout() == message_layout(client._dense_layout_of)
    assert all(link.shared is None for link in client._links)
    assert all((link.stream is not None) == stream for link in client._links)
    trainer.flush_pending_assign()
    for v, ref in zip(trainer.model.trainable_variables, local.trainable_variables):
        np.testing.assert_allclose(v.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    client.close()


def test_the_message_layout_is_the_shared_regions_layout(ps_cluster):
    # The packed step traced for a worker's first pushes (no region attached yet: messages)
    # serves the regions' blocks once they attach, without being traced again.
    cluster = ps_cluster(2)
    client = PSClient(cluster.addrs, shared_memory=True)
    trainer = PSTrainer(_spec(_dense_model), client)
    trainer.train_minibatch(*_data(seed=0))
    first = trainer._packed_fn
    assert first is not None and trainer._packed_fn_layout == message_layout(
        client._dense_layout_of
    )
    for step in range(1, 4):
        trainer.train_minibatch(*_data(seed=step))
    assert all(link.shared is not None for link in client._links)
    assert client.packed_layout() == trainer._packed_fn_layout
    assert trainer._packed_fn is first
    client.close()
