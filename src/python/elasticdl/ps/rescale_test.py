"""A job's PS count changes (master.ps_rescale) through two PS operations: every old PS writes
its shard with the save_checkpoint RPC (all at one version), and every new PS restores from
the newest checkpoint at start-up. The model must come through whole: the old PS's state is
exactly the union of the new PS's (dense parameters, non-trainable state, embedding rows,
optimizer slots of both, model version)."""

import os

import numpy as np
import pytest
from elasticdl.common import tensor_utils as tu
from elasticdl.common.hash_utils import string_to_id
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.ps import checkpoint
from elasticdl.ps.checkpoint_test import DENSE, sharded_params
from elasticdl.ps.server import PSConfig, PSServer

STATE = {f"bn_{i}/moving_mean": np.full((3,), i + 0.5, np.float32) for i in range(4)}


def _server(ps_id: int, num_ps: int, directory) -> PSServer:
    return PSServer(
        PSConfig(
            ps_id=ps_id,
            num_ps_pods=num_ps,
            port=0,
            bind_host="127.0.0.1",
            opt_type="Adam",
            opt_args="learning_rate=0.1;",
            checkpoint_dir=str(directory),
        ),
        secret=None,
    )


def _old_set(num_ps: int, directory, versions, vocabulary: int = 0) -> list[PSServer]:
    servers = []
    for i, p in enumerate(sharded_params(num_ps, vocabulary=vocabulary)):
        server = _server(i, num_ps, directory)
        model = p.to_model_pb()
        model.version = versions[i]
        for name, value in STATE.items():
            if string_to_id(name, num_ps) == i:
                tu.ndarray_to_pb(value, model.state[name])
        server.ps.restore(model)
        servers.append(server)
    return servers


def _union(servers: list[PSServer]) -> dict:
    """Everything the PS set holds, keyed so that two sets compare equal iff they hold the same."""
    out: dict = {"version": {s.params.version for s in servers}}
    for s in servers:
        p = s.params
        for name, value in p.dense.items():
            assert ("dense", name) not in out, f"{name} on two PS"
            out[("dense", name)] = value.tolist()
        for slot, per_param in p.dense_slots.items():
            for name, value in per_param.items():
                out[("slot", slot, name)] = value.tolist()
        for name, value in p.state.items():
            out[("state", name)] = value.tolist()
        for table_name, table in p.embedding_tables.items():
            for slot in (None, "m"):
                ids, rows = table.export(slot) if slot else table.export()
                for i, row in zip(ids.tolist(), rows.tolist()):
                    assert ("row", table_name, slot, i) not in out, f"row {i} on two PS"
                    out[("row", table_name, slot, i)] = row
    return out


class _Context:
    def abort(self, code, details):
        raise AssertionError(f"{code}: {details}")


def _snapshot(servers: list[PSServer]) -> int:
    """What master.ps_rescale asks of the old set: every shard at the newest version."""
    ctx = _Context()
    answers = [s.servicer.save_checkpoint(pb.SaveCheckpointRequest(), ctx) for s in servers]
    target = max(a.version for a in answers)
    for server, answer in zip(servers, answers):
        if answer.version != target:
            server.servicer.save_checkpoint(pb.SaveCheckpointRequest(as_version=target), ctx)
    return target


@pytest.mark.parametrize("old,new", [(1, 2), (2, 1), (2, 3)])
def test_the_new_ps_set_holds_exactly_what_the_old_one_held(tmp_path, old, new):
    before = _old_set(old, tmp_path, versions=[12] * old)
    expected = _union(before)
    assert _snapshot(before) == 12
    after = [_server(i, new, tmp_path) for i in range(new)]
    assert all(s.restored_from == checkpoint.version_dir(str(tmp_path), 12) for s in after)
    assert _union(after) == expected
    assert expected[("dense", next(iter(DENSE)))]  # the comparison saw real content
    for i, s in enumerate(after):  # and each piece is where the new count routes it
        assert all(string_to_id(n, new) == i for n in s.params.dense)
        assert all(string_to_id(n, new) == i for n in s.params.state)
        assert (s.params.embedding_tables["emb"].export()[0] % new == i).all()


@pytest.mark.parametrize("old,new", [(2, 1), (2, 3)])
def test_the_new_ps_set_keeps_the_tables_vocabulary_and_direct_index(tmp_path, old, new):
    """50 of the 60 ids lie below the vocabulary: they go on being resolved by the direct
    index after the change, the 10 past it by the hash map, all rows where they were."""
    before = _old_set(old, tmp_path, versions=[12] * old, vocabulary=50)
    expected = _union(before)
    _snapshot(before)
    after = [_server(i, new, tmp_path) for i in range(new)]
    for s in after:
        table = s.params.embedding_tables["emb"]
        assert table.vocabulary == 50 and table.has_direct_index
    assert _union(after) == expected


def test_a_lagging_ps_is_written_at_the_others_version(tmp_path):
    """One PS refused a push the other took: its shard joins the snapshot's version directory."""
    before = _old_set(2, tmp_path, versions=[12, 11])
    expected = _union(before)
    assert _snapshot(before) == 12
    after = [_server(i, 3, tmp_path) for i in range(3)]
    got = _union(after)
    assert got.pop("version") == {12}
    expected.pop("version")
    assert got == expected


def test_scaling_back_at_the_same_version_replaces_the_other_counts_files(tmp_path):
    """Down then up before any training: one version directory is written by 2 PS, then by
    1; the second snapshot must stay readable (the first's files are dropped)."""
    two = _old_set(2, tmp_path, versions=[12, 12])
    expected = _union(two)
    _snapshot(two)
    one = [_server(0, 1, tmp_path)]
    _snapshot(one)
    vdir = checkpoint.version_dir(str(tmp_path), 12)
    assert sorted(os.listdir(vdir)) == ["variables-0-of-1.ckpt"]
    back = [_server(i, 2, tmp_path) for i in range(2)]
    assert all(s.restored_from == vdir for s in back)
    assert _union(back) == expected
