"""Non-trainable model state (BatchNormalization statistics) on the PS: assigned as pushed (with
gradients, alone, or with the initial model, validated alike), never optimised, checkpointed,
pulled on request, and absent from checkpoints written before it."""
import grpc
import numpy as np
import pytest
from elasticdl.common import tensor_utils as tu
from elasticdl.common.hash_utils import string_to_id
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc
from elasticdl.ps import checkpoint
from elasticdl.ps.errors import PSError
from elasticdl.ps.optimizer import Optimizer, parse_optimizer_config
from elasticdl.ps.parameters import Parameters
from elasticdl.ps.server import PSConfig, PSServer
from elasticdl.ps.updater import ParameterServer, UpdatePolicy

MEAN, VAR = "bn/moving_mean", "bn/moving_variance"


def model_pb(version=0, state=True):
    model = pb.Model(version=version)
    tu.ndarray_to_pb(np.ones(3, np.float32), model.dense_parameters["w"])
    if state:
        tu.ndarray_to_pb(np.zeros(3, np.float32), model.state[MEAN])
        tu.ndarray_to_pb(np.ones(3, np.float32), model.state[VAR])
    return model


def make_ps(policy=None, opt_type="Adam", opt_args="learning_rate=0.1"):
    ps = ParameterServer(
        Parameters(0, 1), Optimizer(parse_optimizer_config(opt_type, opt_args)), policy
    )
    assert ps.push_model(model_pb())
    return ps


def push(ps, version, grad=1.0, **state):
    req = pb.PushGradientsRequest()
    req.gradients.version = version
    tu.ndarray_to_pb(np.full(3, grad, np.float32), req.gradients.dense_parameters["w"])
    for name, value in state.items():
        tu.ndarray_to_pb(np.asarray(value, np.float32), req.gradients.state[name])
    return ps.push_gradients(req)


def test_pushed_state_is_assigned_and_never_optimised():
    ps = make_ps()
    assert push(ps, 0, **{MEAN: [1, 2, 3]}).accepted
    assert not np.allclose(ps.params.dense["w"], 1.0)  # the gradient was applied
    np.testing.assert_array_equal(ps.params.state[MEAN], [1, 2, 3])  # assigned as it came
    np.testing.assert_array_equal(ps.params.state[VAR], [1, 1, 1])  # not pushed: kept
    assert ps.version == 1  # state does not count as an update of its own
    for per_param in ps.params.dense_slots.values():  # Adam keeps slots for "w" only
        assert set(per_param) == {"w"}
    assert push(ps, 1).accepted  # a push without state leaves it alone
    np.testing.assert_array_equal(ps.params.state[MEAN], [1, 2, 3])


def test_a_rejected_push_assigns_no_state():
    ps = make_ps(UpdatePolicy(grads_to_wait=1, sync_version_tolerance=0))
    assert push(ps, 0).accepted
    assert not push(ps, 0, **{MEAN: [9, 9, 9]}).accepted  # stale in sync mode
    np.testing.assert_array_equal(ps.params.state[MEAN], [0, 0, 0])


@pytest.mark.parametrize(
    "state, why",
    [
        ({MEAN: [1, 2]}, "has shape"),
        ({MEAN: [1, np.nan, 3]}, "NaN or infinity"),
        ({"w": [1, 2, 3]}, "also a trained dense parameter"),
    ],
)
def test_bad_state_is_refused_before_anything_is_applied(state, why):
    ps = make_ps()
    before = ps.params.dense["w"].copy()
    with pytest.raises(PSError, match=why):
        push(ps, 0, **state)
    np.testing.assert_array_equal(ps.params.dense["w"], before)
    np.testing.assert_array_equal(ps.params.state[MEAN], [0, 0, 0])
    assert ps.version == 0


def test_state_of_another_ps_is_refused():
    names = [f"bn_{i}/moving_mean" for i in range(8)]
    foreign = next(n for n in names if string_to_id(n, 2) == 1)
    p = Parameters(0, 2)
    with pytest.raises(PSError, match="belongs to another PS"):
        p.check_state({foreign: tu.ndarray_to_pb(np.zeros(1, np.float32))})


def test_state_is_checkpointed_and_resharded(tmp_path):
    full = pb.Model(version=7)
    state = {f"bn_{i}/moving_mean": np.full(2, i, np.float32) for i in range(8)}
    for name, value in state.items():
        tu.ndarray_to_pb(value, full.state[name])
    tu.ndarray_to_pb(np.zeros(2, np.float32), full.dense_parameters["w"])
    for i in range(2):  # two PS, each keeping its own share
        p = Parameters(i, 2)
        p.init_from_model_pb(full)
        assert set(p.state) == {n for n in state if string_to_id(n, 2) == i}
        checkpoint.save_shard(p.to_model_pb(), str(tmp_path), i, 2)
    restored = {}
    for i in range(3):  # resumed on three
        p = Parameters(i, 3)
        p.restore_from_model_pb(checkpoint.restore(str(tmp_path), i, 3))
        assert all(string_to_id(n, 3) == i for n in p.state)
        restored.update(p.state)
    assert restored.keys() == state.keys()
    for name, value in state.items():
        np.testing.assert_array_equal(restored[name], value)


def test_a_checkpoint_without_state_loads_and_takes_state_later(tmp_path):
    # What a PS wrote before it kept state: a Model with dense parameters only.
    checkpoint.save_shard(model_pb(version=5, state=False), str(tmp_path), 0, 1)
    ps = ParameterServer(Parameters(0, 1), Optimizer(parse_optimizer_config("SGD", "")))
    ps.restore(checkpoint.restore(str(tmp_path), 0, 1))
    assert ps.version == 5 and ps.params.state == {}
    assert not ps.pull_dense(-1, include_state=True).state  # workers keep initial values
    assert push(ps, 5, **{MEAN: [4, 5, 6]}).accepted  # then the first task's push brings it
    np.testing.assert_array_equal(ps.params.state[MEAN], [4, 5, 6])
    assert MEAN in ps.snapshot().state


def test_pull_over_grpc_returns_state_only_when_asked():
    server = PSServer(
        PSConfig(port=0, bind_host="127.0.0.1", opt_type="SGD", opt_args="learning_rate=0.1;"),
        secret=None,
    )
    port = server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        stub = pb_grpc.PserverStub(channel)
        stub.push_model(model_pb())
        plain = stub.pull_dense_parameters(pb.PullDenseParametersRequest(version=-1))
        assert set(plain.dense_parameters) == {"w"} and not plain.state
        # Asked for: the state comes whatever the version (nothing newer than 0 here).
        resp = stub.pull_dense_parameters(
            pb.PullDenseParametersRequest(version=0, include_state=True)
        )
        assert not resp.dense_parameters
        assert set(resp.state) == {MEAN, VAR}
        np.testing.assert_array_equal(tu.pb_to_ndarray(resp.state[VAR]), [1, 1, 1])
    finally:
        channel.close()
        server.stop(grace_s=0)


def test_a_checkpoint_the_push_triggers_holds_its_state():
    snapshots = []
    ps = ParameterServer(
        Parameters(0, 1),
        Optimizer(parse_optimizer_config("SGD", "learning_rate=0.1")),
        on_version=lambda v: snapshots.append(ps.params.to_model_pb()),  # as the PS server does
    )
    ps.push_model(model_pb())
    assert push(ps, 0, **{MEAN: [7, 8, 9]}).accepted
    np.testing.assert_array_equal(tu.pb_to_ndarray(snapshots[-1].state[MEAN]), [7, 8, 9])


def state_pb(**state):
    model = pb.Model()
    for name, value in state.items():
        tu.ndarray_to_pb(np.asarray(value, np.float32), model.state[name])
    return model


@pytest.mark.parametrize(
    "policy",
    [UpdatePolicy(use_async=True), UpdatePolicy(grads_to_wait=2)],
    ids=["async", "sync-2"],
)
def test_state_sent_alone_is_assigned_and_nothing_else_changes(policy):
    ps = make_ps(policy)
    assert push(ps, 0).accepted  # Adam now has slots; in sync-2 one gradient waits
    before = {
        "w": ps.params.dense["w"].copy(),
        "slots": {s: {n: v.copy() for n, v in d.items()} for s, d in ps.params.dense_slots.items()},
        "version": ps.version,
    }
    result = ps.push_state(state_pb(**{MEAN: [1, 2, 3]}))
    assert result.accepted and result.version == before["version"]
    assert ps.version == before["version"]  # the master counts versions as minibatches
    np.testing.assert_array_equal(ps.params.state[MEAN], [1, 2, 3])
    np.testing.assert_array_equal(ps.params.state[VAR], [1, 1, 1])  # not sent: kept
    np.testing.assert_array_equal(ps.params.dense["w"], before["w"])
    for slot, per_param in before["slots"].items():
        for name, value in per_param.items():
            np.testing.assert_array_equal(ps.params.dense_slots[slot][name], value)
    if not policy.use_async:
        # It did not count as one of the gradients a sync step waits for: the second
        # gradient push still completes the step, and only it.
        assert push(ps, 0).accepted and ps.version == 1


def test_state_sent_alone_to_a_ps_without_a_model_is_not_taken():
    ps = ParameterServer(Parameters(0, 1), Optimizer(parse_optimizer_config("SGD", "")))
    assert not ps.push_state(state_pb(**{MEAN: [1, 2, 3]})).accepted
    assert ps.params.state == {} and not ps.params.initialized


@pytest.mark.parametrize(
    "state, why",
    [
        ({MEAN: [1, 2]}, "has shape"),
        ({MEAN: [1, np.inf, 3]}, "NaN or infinity"),
        ({VAR: [1, 1, 1], "w": [1, 2, 3]}, "also a trained dense parameter"),
    ],
)
def test_bad_state_sent_alone_is_refused_whole(state, why):
    ps = make_ps()
    with pytest.raises(PSError, match=why):
        ps.push_state(state_pb(**state))
    np.testing.assert_array_equal(ps.params.state[MEAN], [0, 0, 0])
    np.testing.assert_array_equal(ps.params.state[VAR], [1, 1, 1])


def _model_with_state(state, table=True):
    model = model_pb(state=False)
    if table:  # a table the refused push must not create either
        model.embedding_table_infos.add(name="emb", dim=2, initializer="uniform")
    for name, value in state.items():
        tu.ndarray_to_pb(np.asarray(value, np.float32), model.state[name])
    return model


@pytest.mark.parametrize(
    "state, why",
    [
        ({MEAN: [0, np.nan, 0]}, "NaN or infinity"),
        ({"w": [1, 2, 3]}, "'w' is also a trained dense parameter"),
    ],
)
def test_push_model_with_bad_state_is_refused_and_nothing_is_taken(state, why):
    ps = ParameterServer(Parameters(0, 1), Optimizer(parse_optimizer_config("SGD", "")))
    with pytest.raises(PSError, match=why):
        ps.push_model(_model_with_state(state))
    p = ps.params
    assert not p.initialized and not p.dense and not p.state and not p.embedding_tables
    assert ps.push_model(_model_with_state({MEAN: [0, 0, 0]}))  # a good one is then taken


def test_push_model_state_of_another_shape_than_the_ps_holds_is_refused():
    ps = make_ps()
    with pytest.raises(PSError, match=r"has shape \(2,\), the PS holds \(3,\)"):
        ps.push_model(_model_with_state({MEAN: [1, 2]}, table=False))
    np.testing.assert_array_equal(ps.params.state[MEAN], [0, 0, 0])
    assert not ps.push_model(model_pb())  # a valid later push: ignored as before


def test_push_state_and_a_refused_push_model_over_grpc(tmp_path):
    server = PSServer(
        PSConfig(
            port=0,
            bind_host="127.0.0.1",
            opt_type="SGD",
            opt_args="learning_rate=0.1;",
            checkpoint_dir=str(tmp_path),
            checkpoint_steps=1,
        ),
        secret=None,
    )
    port = server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        stub = pb_grpc.PserverStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.push_model(_model_with_state({MEAN: [np.nan] * 3}))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == "state variable 'bn/moving_mean' holds NaN or infinity"
        assert not server.params.initialized
        stub.push_model(model_pb())
        req = pb.PushGradientsRequest(gradients=pb.Model(version=0))
        tu.ndarray_to_pb(np.ones(3, np.float32), req.gradients.dense_parameters["w"])
        stub.push_gradients(req)  # version 1, checkpointed (checkpoint_steps=1)
        resp = stub.push_state(state_pb(**{MEAN: [4, 5, 6]}))
        assert resp.accepted and resp.version == 1 and server.params.version == 1
        # The checkpoint of version 1 is written again with the state that came after it.
        server.checkpointer.flush()
        saved = checkpoint.restore(str(tmp_path / "version-1"), 0, 1)
        np.testing.assert_array_equal(tu.pb_to_ndarray(saved.state[MEAN]), [4, 5, 6])
        with pytest.raises(grpc.RpcError) as bad:
            stub.push_state(state_pb(**{MEAN: [1, 2]}))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        channel.close()
        server.stop(grace_s=0)
