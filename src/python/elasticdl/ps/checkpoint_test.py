import os

import numpy as np
import pytest
from elasticdl.common import tensor_utils as tu
from elasticdl.common.hash_utils import string_to_id
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.ps import checkpoint
from elasticdl.ps.parameters import Parameters

DENSE = {f"layer_{i}/kernel": np.full((2, 2), i, np.float32) for i in range(10)}
IDS = np.arange(0, 60, 1)


def sharded_params(num_ps, version=12, vocabulary=0):
    """num_ps shards of one model: dense params, 60 rows of 'emb' and Adam-like slots.
    ``vocabulary``: the table's (0: unknown)."""
    full = pb.Model(version=version)
    for name, value in DENSE.items():
        tu.ndarray_to_pb(value, full.dense_parameters[name])
    full.embedding_table_infos.add(name="emb", dim=2, initializer="zeros", vocabulary=vocabulary)
    shards = []
    for i in range(num_ps):
        p = Parameters(i, num_ps)
        p.init_from_model_pb(full)
        table = p.embedding_tables["emb"]
        mine = IDS[IDS % num_ps == i]
        table.set(mine, np.stack([mine, -mine], axis=1).astype(np.float32))
        table.set(mine, np.stack([mine, mine], axis=1).astype(np.float32) * 10, slot="m")
        for name in p.dense:
            p.dense_slot("v", name)[:] = DENSE[name] + 100
        shards.append(p)
    return shards


def save_all(shards, directory, keep=0):
    return [
        checkpoint.save_shard(p.to_model_pb(), str(directory), p.ps_id, p.num_ps, keep)
        for p in shards
    ]


def test_layout_and_round_trip(tmp_path):
    paths = save_all(sharded_params(1), tmp_path)
    assert paths == [str(tmp_path / "version-12" / "variables-0-of-1.ckpt")]
    assert [n for n in os.listdir(tmp_path / "version-12")] == ["variables-0-of-1.ckpt"]
    q = Parameters(0, 1)
    q.restore_from_model_pb(checkpoint.restore(str(tmp_path), 0, 1))
    assert q.version == 12 and set(q.dense) == set(DENSE)
    ids, values = q.embedding_tables["emb"].export()
    np.testing.assert_array_equal(ids, IDS)
    np.testing.assert_array_equal(values[:, 1], -IDS)
    np.testing.assert_array_equal(q.embedding_tables["emb"].export("m")[1][:, 0], IDS * 10)
    np.testing.assert_array_equal(q.dense_slots["v"]["layer_3/kernel"], np.full((2, 2), 103))


@pytest.mark.parametrize("old,new", [(2, 3), (3, 1), (1, 4)])
def test_resharding_puts_every_param_and_row_on_exactly_one_new_ps(tmp_path, old, new):
    save_all(sharded_params(old), tmp_path)
    vdir = str(tmp_path / "version-12")
    restored = []
    for i in range(new):
        p = Parameters(i, new)
        p.restore_from_model_pb(checkpoint.restore(vdir, i, new))
        restored.append(p)
        assert p.version == 12
        assert all(string_to_id(n, new) == i for n in p.dense)
        assert set(p.dense_slots.get("v", {})) == set(p.dense)  # slots follow their parameter
        ids, values = p.embedding_tables["emb"].export()
        assert (ids % new == i).all()
        np.testing.assert_array_equal(values[:, 0], ids)
        m_ids, m = p.embedding_tables["emb"].export("m")
        np.testing.assert_array_equal(m_ids, ids)
        np.testing.assert_array_equal(m[:, 1], ids * 10)
    dense_names = sorted(n for p in restored for n in p.dense)
    assert dense_names == sorted(DENSE)  # each exactly once
    all_ids = np.sort(np.concatenate([p.embedding_tables["emb"].ids for p in restored]))
    np.testing.assert_array_equal(all_ids, IDS)
    for p in restored:
        for name, value in p.dense.items():
            np.testing.assert_array_equal(value, DENSE[name])


def table_content(shards, slot=None) -> tuple[list, list]:
    """(ids, rows) of 'emb' (or of one of its slots) over all shards, sorted by id."""
    parts = [p.embedding_tables["emb"].export(slot) for p in shards]
    ids = np.concatenate([i for i, _ in parts])
    rows = np.concatenate([r for _, r in parts])
    order = np.argsort(ids)
    return ids[order].tolist(), rows[order].tolist()


def save_streamed(shards, directory):
    """What the background writer (elasticdl.ps.snapshot_writer) writes for each shard."""
    for p in shards:
        pieces, _ = checkpoint.shard_pieces(p)
        checkpoint.save_shard_pieces(pieces, p.version, str(directory), p.ps_id, p.num_ps)


# 50: ids 50..59 of the 60 rows lie past the vocabulary, in the hash map beside the direct index.
@pytest.mark.parametrize("save", [save_all, save_streamed])
@pytest.mark.parametrize("old,new", [(2, 2), (2, 3)])
def test_a_restored_table_keeps_its_vocabulary_and_direct_index(tmp_path, save, old, new):
    before = sharded_params(old, vocabulary=50)
    assert all(p.embedding_tables["emb"].has_direct_index for p in before)
    save(before, tmp_path)
    after = []
    for i in range(new):
        p = Parameters(i, new)
        p.restore_from_model_pb(checkpoint.restore(str(tmp_path), i, new))
        after.append(p)
        table = p.embedding_tables["emb"]
        assert table.vocabulary == 50 and table.has_direct_index
    for slot in (None, "m"):
        assert table_content(after, slot) == table_content(before, slot)
    assert table_content(after)[0] == IDS.tolist()


def test_a_checkpoint_without_vocabularies_restores_tables_without_a_direct_index(tmp_path):
    """Written before checkpoints carried the vocabulary: 0 (unknown), the hash map alone."""
    before = sharded_params(2, vocabulary=50)
    for p in before:
        model = p.to_model_pb()
        for info in model.embedding_table_infos:
            info.ClearField("vocabulary")
        checkpoint.save_shard(model, str(tmp_path), p.ps_id, p.num_ps)
    after = []
    for i in range(2):
        p = Parameters(i, 2)
        p.restore_from_model_pb(checkpoint.restore(str(tmp_path), i, 2))
        after.append(p)
        assert p.embedding_tables["emb"].vocabulary == 0
        assert not p.embedding_tables["emb"].has_direct_index
    for slot in (None, "m"):
        assert table_content(after, slot) == table_content(before, slot)


def test_incomplete_and_mixed_versions_are_rejected(tmp_path):
    shards = sharded_params(2)
    checkpoint.save_shard(shards[0].to_model_pb(), str(tmp_path), 0, 2)
    assert checkpoint.get_latest_valid_version_dir(str(tmp_path)) is None
    with pytest.raises(checkpoint.CheckpointError, match="no valid checkpoint"):
        checkpoint.restore(str(tmp_path), 0, 1)
    with pytest.raises(checkpoint.CheckpointError, match="incomplete"):
        checkpoint.restore(str(tmp_path / "version-12"), 0, 1)
    other = shards[1].to_model_pb()
    other.version = 13
    path = checkpoint.shard_path(str(tmp_path), 12, 1, 2)
    with open(path, "wb") as f:
        f.write(other.SerializeToString())
    with pytest.raises(checkpoint.CheckpointError, match="mixes versions"):
        checkpoint.restore(str(tmp_path), 0, 1)
    with open(path, "wb") as f:
        f.write(b"\xff\xff not a model")
    with pytest.raises(checkpoint.CheckpointError, match="corrupt"):
        checkpoint.restore(str(tmp_path), 0, 1)


def test_keep_checkpoint_max_deletes_oldest_valid_versions_only(tmp_path):
    shards = sharded_params(2)
    for version in (1, 2, 3, 4):
        for p in shards:
            p.version = version
        save_all(shards, tmp_path)
    for p in shards:
        p.version = 5
    checkpoint.save_shard(shards[0].to_model_pb(), str(tmp_path), 0, 2)  # 5 in progress
    for p in shards:
        p.version = 6
    save_all(shards, tmp_path, keep=2)
    assert sorted(os.listdir(tmp_path)) == ["version-4", "version-5", "version-6"]
    assert [v for v, _ in checkpoint.list_version_dirs(str(tmp_path))] == [4, 6]
    assert os.path.isdir(tmp_path / "version-5")  # incomplete: left for its other writer
    assert not [n for n in os.listdir(tmp_path / "version-6") if n.endswith(".tmp")]


def test_a_corrupt_newest_version_falls_back_to_the_one_before(tmp_path):
    save_all(sharded_params(2, version=10), tmp_path)
    save_all(sharded_params(2, version=20), tmp_path)
    # The newest version is complete by name but one of its files is garbage (a full disk).
    (tmp_path / "version-20" / "variables-1-of-2.ckpt").write_bytes(b"\xff" * 64)
    model, vdir = checkpoint.restore_newest_readable(str(tmp_path), 0, 2)
    assert model.version == 10 and vdir == str(tmp_path / "version-10")
    # An explicitly named version does not fall back: the user asked for that one.
    with pytest.raises(checkpoint.CheckpointError, match="corrupt"):
        checkpoint.restore(str(tmp_path / "version-20"), 0, 2)
    (tmp_path / "version-10" / "variables-0-of-2.ckpt").write_bytes(b"\xff" * 64)
    assert checkpoint.restore_newest_readable(str(tmp_path), 0, 2) is None
