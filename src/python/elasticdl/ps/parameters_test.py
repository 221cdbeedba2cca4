import numpy as np
import pytest
from elasticdl.common import tensor_utils as tu
from elasticdl.common.hash_utils import string_to_id
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.ps.errors import NotFoundError, PSError
from elasticdl.ps.parameters import Parameters, is_slot_key, parse_slot_key, slot_key

NAMES = [f"dense_{i}/kernel" for i in range(12)]


def make_model(version=0):
    m = pb.Model(version=version)
    for i, name in enumerate(NAMES):
        tu.ndarray_to_pb(np.full((2, 3), i, np.float32), m.dense_parameters[name])
    m.embedding_table_infos.add(name="emb", dim=4, initializer="zeros")
    return m


def test_each_dense_param_lands_on_exactly_the_ps_its_name_hashes_to():
    shards = [Parameters(i, 3) for i in range(3)]
    for p in shards:
        assert p.init_from_model_pb(make_model(version=5))
        assert p.initialized and p.version == 5
        assert all(string_to_id(n, 3) == p.ps_id for n in p.dense)
        assert "emb" in p.embedding_tables
    owners = [sum(n in p.dense for p in shards) for n in NAMES]
    assert owners == [1] * len(NAMES)
    assert {len(p.dense) for p in shards} != {0}  # 12 names do spread


def test_first_push_wins():
    p = Parameters(0, 1)
    assert p.init_from_model_pb(make_model(version=1))
    second = make_model(version=9)
    tu.ndarray_to_pb(np.full((2, 3), 100, np.float32), second.dense_parameters[NAMES[0]])
    assert not p.init_from_model_pb(second)
    assert p.version == 1
    np.testing.assert_array_equal(p.dense[NAMES[0]], np.zeros((2, 3)))
    p.dense[NAMES[0]] += 1  # stored params are private and writable
    assert p.dense[NAMES[0]].flags.writeable


def test_check_grad_validates_everything_before_returning():
    p = Parameters(0, 2)
    p.init_from_model_pb(make_model())
    mine = next(iter(p.dense))
    foreign = next(n for n in NAMES if n not in p.dense)

    g = pb.Model()
    tu.ndarray_to_pb(np.ones((2, 3), np.float32), g.dense_parameters[mine])
    tu.indexed_rows_to_pb(
        tu.IndexedRows(np.ones((2, 4), np.float32), np.array([0, 4])), g.embedding_tables["emb"]
    )
    dense, sparse = p.check_grad(g)
    assert dense[mine].shape == (2, 3)
    np.testing.assert_array_equal(sparse["emb"][0], [0, 4])

    bad = pb.Model()
    tu.ndarray_to_pb(np.ones((3, 2), np.float32), bad.dense_parameters[mine])
    with pytest.raises(PSError, match=r"has shape \(3, 2\), the parameter has \(2, 3\)"):
        p.check_grad(bad)
    bad = pb.Model()
    tu.ndarray_to_pb(np.ones((2, 3), np.float32), bad.dense_parameters[foreign])
    with pytest.raises(NotFoundError, match="belongs to another PS"):
        p.check_grad(bad)
    bad = pb.Model()
    tu.indexed_rows_to_pb(
        tu.IndexedRows(np.ones((1, 4), np.float32), np.array([3])), bad.embedding_tables["emb"]
    )
    with pytest.raises(PSError, match="belong to other PS"):
        p.check_grad(bad)
    bad = pb.Model()
    tu.indexed_rows_to_pb(
        tu.IndexedRows(np.ones((1, 5), np.float32), np.array([2])), bad.embedding_tables["emb"]
    )
    with pytest.raises(PSError, match="expected"):
        p.check_grad(bad)
    bad = pb.Model()
    tu.indexed_rows_to_pb(
        tu.IndexedRows(np.ones((1, 4), np.float32), np.array([2])), bad.embedding_tables["nope"]
    )
    with pytest.raises(NotFoundError, match="unknown on PS 0"):
        p.check_grad(bad)


def test_table_info_conflicts_and_dtypes():
    p = Parameters()
    p.set_embedding_table_infos([pb.EmbeddingTableInfo(name="e", dim=4)])
    p.set_embedding_table_infos([pb.EmbeddingTableInfo(name="e", dim=4)])  # idempotent
    with pytest.raises(PSError, match="already has dim 4"):
        p.set_embedding_table_infos([pb.EmbeddingTableInfo(name="e", dim=8)])
    with pytest.raises(PSError, match="only float32"):
        p.set_embedding_table_infos([pb.EmbeddingTableInfo(name="f", dim=2, dtype=pb.DT_FLOAT64)])
    with pytest.raises(PSError, match="ps_id"):
        Parameters(2, 2)


def test_model_pb_round_trip_with_slots():
    p = Parameters(0, 1)
    p.init_from_model_pb(make_model(version=3))
    table = p.embedding_tables["emb"]
    table.get(np.array([2, 1]))
    table.slot("m")[:] = 7
    p.dense_slot("v", NAMES[0])[:] = 3
    model = p.to_model_pb()
    assert slot_key("m", "emb") in model.embedding_tables
    assert is_slot_key(slot_key("v", NAMES[0])) and parse_slot_key("slot:v:a:b") == ("v", "a:b")
    assert [i.name for i in model.embedding_table_infos] == ["emb"]

    q = Parameters(0, 1)
    q.restore_from_model_pb(pb.Model.FromString(model.SerializeToString()))
    assert q.initialized and q.version == 3
    assert set(q.dense) == set(NAMES)
    np.testing.assert_array_equal(q.dense_slots["v"][NAMES[0]], np.full((2, 3), 3))
    ids, m = q.embedding_tables["emb"].export("m")
    np.testing.assert_array_equal(ids, [1, 2])
    np.testing.assert_array_equal(m, np.full((2, 4), 7))


def test_a_model_pb_round_trip_keeps_the_vocabulary_and_the_direct_index():
    model = make_model(version=3)
    model.embedding_table_infos[0].vocabulary = 40
    p = Parameters(0, 1)
    p.init_from_model_pb(model)
    table = p.embedding_tables["emb"]
    table.get(np.array([3, 45, 7, 39, 60]))  # 45 and 60: past the vocabulary, in the hash map
    table.slot("m")[:] = np.arange(len(table), dtype=np.float32)[:, None]
    written = p.to_model_pb()
    assert [(i.name, i.vocabulary) for i in written.embedding_table_infos] == [("emb", 40)]

    q = Parameters(0, 1)
    q.restore_from_model_pb(pb.Model.FromString(written.SerializeToString()))
    restored = q.embedding_tables["emb"]
    assert restored.vocabulary == 40 and restored.has_direct_index
    for slot in (None, "m"):
        before, after = table.export(slot), restored.export(slot)
        np.testing.assert_array_equal(after[0], [3, 7, 39, 45, 60])
        np.testing.assert_array_equal(after[0], before[0])
        np.testing.assert_array_equal(after[1], before[1])


@pytest.mark.parametrize("num_ps", [1, 2])
def test_a_known_vocabulary_changes_no_row_and_no_checkpoint_byte_but_its_own(num_ps):
    """Tables made from infos with a vocabulary (direct index) and without (hash map only) go
    through the same pulls and pushes, ids past the vocabulary included: the same rows, the
    same checkpoint (both writers) but for the vocabulary in the table's info, and a restore
    of it gives the same table back."""
    from elasticdl.ps import checkpoint
    from elasticdl.ps.optimizer import Optimizer, OptimizerConfig

    def trained(vocabulary: int) -> Parameters:
        model = make_model(version=5)
        model.embedding_table_infos.add(name="wide", dim=3, vocabulary=vocabulary)
        p = Parameters(num_ps - 1, num_ps, seed=4)
        p.init_from_model_pb(model)
        opt = Optimizer(OptimizerConfig("Adagrad", learning_rate=0.5))
        rng = np.random.default_rng(9)
        for step in range(1, 12):
            ids = rng.integers(0, 600, 400)
            ids = p.check_embedding_ids("wide", ids[p.owns_ids(ids)])
            p.embedding_tables["wide"].get(ids, checked=True)
            push = np.unique(ids)
            grads = rng.normal(size=(push.size, 3)).astype(np.float32)
            opt.apply_sparse(p.embedding_tables["wide"], push, grads, 0.5, step, ids_checked=True)
        return p

    with_vocab, without = trained(300), trained(0)
    assert with_vocab.embedding_tables["wide"]._index.direct_size == 300
    assert with_vocab.embedding_tables["wide"].vocabulary == 300
    assert without.embedding_tables["wide"]._index.direct_size == 0
    assert (with_vocab.embedding_tables["wide"].ids >= 300).any()

    def without_vocabulary(model: pb.Model) -> pb.Model:
        for info in model.embedding_table_infos:
            info.ClearField("vocabulary")
        return model

    written = with_vocab.to_model_pb()
    assert [i.vocabulary for i in written.embedding_table_infos] == [0, 300]
    model = without_vocabulary(written).SerializeToString()
    assert model == without.to_model_pb().SerializeToString()
    streamed = [
        pb.Model.FromString(b"".join(bytes(memoryview(x)) for x in checkpoint.shard_pieces(p)[0]))
        for p in (with_vocab, without)
    ]
    # Rows come in block order there, not by id: only the infos must read the same.
    assert [i.vocabulary for i in streamed[0].embedding_table_infos] == [0, 300]
    assert without_vocabulary(streamed[0]) == streamed[1]

    # Restores (an older checkpoint says no vocabulary; one that says it gets a direct index),
    # then pulls of known and new rows, past the vocabulary too.
    pulled = []
    for vocabulary in (0, 300):
        shard = pb.Model.FromString(model)
        shard.embedding_table_infos[1].vocabulary = vocabulary
        restored = Parameters(num_ps - 1, num_ps, seed=4)
        restored.restore_from_model_pb(shard)
        table = restored.embedding_tables["wide"]
        assert table._index.direct_size == vocabulary
        expected = shard.SerializeToString(deterministic=True)
        assert restored.to_model_pb().SerializeToString(deterministic=True) == expected
        pulled.append(table.get(np.arange(num_ps - 1, 700, num_ps)).tobytes())
    assert pulled[0] == pulled[1]
