"""Sync/async update policy numerics through ParameterServer (no network)."""
import numpy as np
import pytest
from elasticdl.common import tensor_utils as tu
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.ps.errors import PSError
from elasticdl.ps.optimizer import Optimizer, parse_optimizer_config
from elasticdl.ps.parameters import Parameters
from elasticdl.ps.updater import ParameterServer, UpdatePolicy


def make_ps(policy, opt_args="learning_rate=0.1", opt_type="SGD"):
    versions = []
    ps = ParameterServer(
        Parameters(0, 1),
        Optimizer(parse_optimizer_config(opt_type, opt_args)),
        policy,
        on_version=versions.append,
    )
    model = pb.Model(version=0)
    tu.ndarray_to_pb(np.zeros(3, np.float32), model.dense_parameters["w"])
    model.embedding_table_infos.add(name="e", dim=2, initializer="zeros")
    assert ps.push_model(model)
    return ps, versions


def push(ps, version, dense=None, ids=None, rows=None, lr=0.0, push_id=0, worker_id=0):
    req = pb.PushGradientsRequest(learning_rate=lr, push_id=push_id, worker_id=worker_id)
    req.gradients.version = version
    if dense is not None:
        tu.ndarray_to_pb(np.asarray(dense, np.float32), req.gradients.dense_parameters["w"])
    if ids is not None:
        tu.indexed_rows_to_pb(
            tu.IndexedRows(np.asarray(rows, np.float32), np.asarray(ids)),
            req.gradients.embedding_tables["e"],
        )
    return ps.push_gradients(req)


def test_sync_averages_dense_sums_sparse_and_applies_after_k_pushes():
    ps, versions = make_ps(UpdatePolicy(grads_to_wait=2))
    r1 = push(ps, 0, dense=[1, 2, 3], ids=[4], rows=[[1, 1]])
    assert (r1.accepted, r1.version) == (True, 0)
    np.testing.assert_array_equal(ps.params.dense["w"], 0)  # buffered, not applied
    r2 = push(ps, 0, dense=[3, 2, 1], ids=[4, 6], rows=[[2, 2], [1, 0]])
    assert (r2.accepted, r2.version) == (True, 1)
    np.testing.assert_allclose(ps.params.dense["w"], [-0.2, -0.2, -0.2])  # mean 2 * lr 0.1
    np.testing.assert_allclose(ps.pull_embedding_vectors("e", [4, 6]), [[-0.3, -0.3], [-0.1, 0]])
    assert versions == [1]


def test_sync_rejects_stale_gradients_beyond_tolerance():
    ps, _ = make_ps(UpdatePolicy(grads_to_wait=1, sync_version_tolerance=1))
    for v in range(3):
        assert push(ps, v, dense=[1, 0, 0]).accepted
    assert ps.version == 3
    assert push(ps, 2, dense=[1, 0, 0]).accepted  # 3 - 1 = 2 is within tolerance
    before = ps.params.dense["w"].copy()
    result = push(ps, 2, dense=[1, 0, 0])  # PS now at 4: 2 < 4 - 1
    assert (result.accepted, result.version) == (False, 4)
    np.testing.assert_array_equal(ps.params.dense["w"], before)


def test_sync_uses_the_latest_request_learning_rate():
    ps, _ = make_ps(UpdatePolicy(grads_to_wait=2))
    push(ps, 0, dense=[1, 1, 1], lr=0.5)
    push(ps, 0, dense=[1, 1, 1], lr=0.0)  # 0 = "use the last one given / configured"
    np.testing.assert_allclose(ps.params.dense["w"], -0.5)


def test_async_applies_each_push_and_modulates_lr_by_staleness():
    ps, versions = make_ps(UpdatePolicy(use_async=True, lr_staleness_modulation=True))
    for _ in range(3):
        assert push(ps, 0, dense=[1, 0, 0]).accepted
    # staleness 1 (max(1, 0)), then 1, then 2
    np.testing.assert_allclose(ps.params.dense["w"], [-(0.1 + 0.1 + 0.05), 0, 0], rtol=1e-6)
    r = push(ps, 0, dense=[0, 1, 0], lr=0.3)  # request lr 0.3 / staleness 3
    assert r.version == 4 and versions == [1, 2, 3, 4]
    np.testing.assert_allclose(ps.params.dense["w"][1], -0.1, rtol=1e-6)


def test_async_without_modulation_ignores_staleness():
    ps, _ = make_ps(UpdatePolicy(use_async=True, grads_to_wait=5))
    assert ps.policy.grads_to_wait == 1
    for _ in range(3):
        push(ps, 0, dense=[1, 0, 0])
    np.testing.assert_allclose(ps.params.dense["w"][0], -0.3, rtol=1e-6)


def test_adam_step_follows_version_so_it_survives_restore():
    ps, _ = make_ps(UpdatePolicy(use_async=True), "learning_rate=0.1", "Adam")
    push(ps, 0, dense=[1, 1, 1])
    restored, _ = make_ps(UpdatePolicy(use_async=True), "learning_rate=0.1", "Adam")
    restored.restore(pb.Model.FromString(ps.snapshot().SerializeToString()))
    push(ps, 1, dense=[1, -1, 2])
    push(restored, 1, dense=[1, -1, 2])
    np.testing.assert_array_equal(ps.params.dense["w"], restored.params.dense["w"])


def test_uninitialised_ps_rejects_and_bad_push_changes_nothing():
    ps = ParameterServer(Parameters(), Optimizer(parse_optimizer_config("SGD", "")))
    assert not ps.push_gradients(pb.PushGradientsRequest()).accepted
    ps, _ = make_ps(UpdatePolicy(use_async=True))
    req = pb.PushGradientsRequest()
    tu.ndarray_to_pb(np.ones(3, np.float32), req.gradients.dense_parameters["w"])
    tu.indexed_rows_to_pb(
        tu.IndexedRows(np.ones((1, 3), np.float32), np.array([1])),
        req.gradients.embedding_tables["e"],
    )
    with pytest.raises(PSError):
        ps.push_gradients(req)
    np.testing.assert_array_equal(ps.params.dense["w"], 0)
    assert ps.version == 0
    with pytest.raises(PSError, match="grads_to_wait"):
        UpdatePolicy(grads_to_wait=0)


@pytest.mark.parametrize("use_async", [True, False])
@pytest.mark.parametrize(
    "dense, rows, lr, message",
    [
        ([1, np.nan, 1], None, 0.0, "dense parameter 'w' holds NaN or infinity"),
        ([1, 1, np.inf], None, 0.0, "dense parameter 'w' holds NaN or infinity"),
        (None, [[np.nan, 0]], 0.0, "embedding table 'e' holds NaN or infinity"),
        ([1, 1, 1], None, float("inf"), "learning rate inf refused"),
        ([1, 1, 1], None, float("nan"), "learning rate nan refused"),
        ([1, 1, 1], None, -0.1, "learning rate -0.1 refused"),
        ([1, 1, 1], None, 1e6, "learning rate 1e\\+06 refused"),
    ],
)
def test_pushes_that_would_wreck_the_model_are_refused(use_async, dense, rows, lr, message):
    ps, versions = make_ps(UpdatePolicy(use_async=use_async))
    with pytest.raises(PSError, match=message):
        push(ps, 0, dense=dense, ids=[1] if rows else None, rows=rows, lr=lr)
    np.testing.assert_array_equal(ps.params.dense["w"], 0)
    assert ps.version == 0 and versions == []
    # The next sound push is applied as usual.
    assert push(ps, 0, dense=[1, 1, 1], lr=0.5).accepted
    np.testing.assert_allclose(ps.params.dense["w"], -0.5)


@pytest.mark.parametrize("use_async", [True, False])
def test_a_push_and_a_pull_check_their_ids_once(use_async, monkeypatch):
    """The parameters check a request's ids (integers, non-negative, owned); the table then
    trusts them instead of checking them again. Negative ids are still refused."""
    from elasticdl.ps import embedding_table, parameters

    checks, rechecks = [], []
    real_id_array, real_check_ids = parameters.id_array, embedding_table.check_ids

    def counted(ids, table):
        checks.append(table)
        return real_id_array(ids, table)

    def counted_again(ids, table):
        rechecks.append(table)
        return real_check_ids(ids, table)

    monkeypatch.setattr(parameters, "id_array", counted)
    monkeypatch.setattr(embedding_table, "check_ids", counted_again)
    ps, _ = make_ps(UpdatePolicy(use_async=use_async))
    assert push(ps, 0, ids=[1, 5], rows=[[1, 1], [2, 2]]).accepted
    np.testing.assert_allclose(ps.pull_embedding_vectors("e", [5, 1]), [[-0.2, -0.2], [-0.1, -0.1]])
    assert checks == ["e", "e"]  # one for the push, one for the pull
    assert rechecks == []  # the table trusts them
    with pytest.raises(PSError, match="non-negative"):
        push(ps, 1, ids=[-1], rows=[[1, 1]])
    with pytest.raises(PSError, match="non-negative"):
        ps.pull_embedding_vectors("e", [-3])


@pytest.mark.parametrize("use_async", [True, False])
def test_a_numbered_push_sent_again_is_answered_not_taken_twice(use_async):
    ps, versions = make_ps(UpdatePolicy(use_async=use_async))
    first = push(ps, 0, dense=[1, 0, 0], ids=[4], rows=[[1, 1]], push_id=7, worker_id=3)
    again = push(ps, 0, dense=[1, 0, 0], ids=[4], rows=[[1, 1]], push_id=7, worker_id=3)
    assert (first.accepted, first.version) == (True, 1)
    assert (again.accepted, again.version) == (True, 1)
    np.testing.assert_allclose(ps.params.dense["w"], [-0.1, 0, 0])
    np.testing.assert_allclose(ps.pull_embedding_vectors("e", [4]), [[-0.1, -0.1]])
    assert versions == [1]
    # The answer a resend gets carries the version of now (another worker pushed meanwhile).
    assert push(
        ps, 1, dense=[0, 1, 0], push_id=7, worker_id=4
    ).accepted  # same number, other worker
    assert push(ps, 1, dense=[1, 0, 0], push_id=7, worker_id=3).version == 2
    np.testing.assert_allclose(ps.params.dense["w"], [-0.1, -0.1, 0])
    # Its next push is taken; unnumbered pushes always are.
    assert push(ps, 2, dense=[0, 0, 1], push_id=8, worker_id=3).version == 3
    assert push(ps, 3, dense=[0, 0, 1]).version == 4
    assert push(ps, 4, dense=[0, 0, 1]).version == 5
    np.testing.assert_allclose(ps.params.dense["w"], [-0.1, -0.1, -0.3], rtol=1e-6)


def test_a_resent_push_counts_once_towards_a_sync_round_and_keeps_its_verdict():
    ps, versions = make_ps(UpdatePolicy(grads_to_wait=2, sync_version_tolerance=0))
    assert push(ps, 0, dense=[2, 0, 0], push_id=11, worker_id=1).version == 0
    assert push(ps, 0, dense=[2, 0, 0], push_id=11, worker_id=1).version == 0  # not a 2nd grad
    np.testing.assert_array_equal(ps.params.dense["w"], 0)
    assert push(ps, 0, dense=[0, 2, 0], push_id=5, worker_id=2).version == 1
    np.testing.assert_allclose(ps.params.dense["w"], [-0.1, -0.1, 0])  # the mean of two
    # A stale push is refused, and so is its resend, which is not taken either.
    assert not push(ps, 0, dense=[9, 9, 9], push_id=12, worker_id=1).accepted
    assert not push(ps, 0, dense=[9, 9, 9], push_id=12, worker_id=1).accepted
    assert versions == [1]


def test_a_push_that_failed_is_not_remembered():
    ps, _ = make_ps(UpdatePolicy(use_async=True))
    with pytest.raises(PSError, match="NaN"):
        push(ps, 0, dense=[np.nan, 0, 0], push_id=21, worker_id=1)
    assert push(ps, 0, dense=[1, 0, 0], push_id=21, worker_id=1).version == 1
