"""Checkpoints written by a forked child from a copy-on-write snapshot: the file holds the model
at the snapshot's version whatever the PS does meanwhile, one write runs at a time, and a
writer killed mid-write (or whose PS dies) leaves the previous checkpoint whole and nothing
half-written behind."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from elasticdl.common import tensor_utils as tu
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.ps import checkpoint, snapshot_writer
from elasticdl.ps.checkpointer import COPIED, SKIPPED, STARTED, CheckpointConfig, Checkpointer
from elasticdl.ps.optimizer import Optimizer, parse_optimizer_config
from elasticdl.ps.parameters import Parameters
from elasticdl.ps.snapshot_writer import SnapshotWriter
from elasticdl.ps.updater import ParameterServer

HANG_GUARD_S = 60  # only so that a regression fails instead of hanging

DIM = 16


def make_params(rows: int, version: int = 10, ps_id: int = 0, num_ps: int = 1) -> Parameters:
    """A shard with a dense parameter and its Adam slots, state, and a table with slots."""
    p = Parameters(ps_id, num_ps)
    model = pb.Model(version=version)
    tu.ndarray_to_pb(np.arange(12, dtype=np.float32).reshape(3, 4), model.dense_parameters["w"])
    tu.ndarray_to_pb(np.full(4, 0.5, np.float32), model.state["bn/mean"])
    model.embedding_table_infos.add(name="emb", dim=DIM, initializer="uniform")
    p.init_from_model_pb(model)
    ids = np.arange(rows, dtype=np.int64) * num_ps + ps_id
    table = p.embedding_tables["emb"]
    table.set(ids, np.outer(ids, np.ones(DIM)).astype(np.float32))
    table.set(ids, np.full((rows, DIM), 2.0, np.float32), slot="m")
    table.set(ids, np.full((rows, DIM), 3.0, np.float32), slot="v")
    if "w" in p.dense:  # this shard's
        p.dense_slot("m", "w")[:] = 7.0
    p.version = version
    return p


def as_dict(model: pb.Model) -> dict:
    """What a shard holds, independent of the order of rows and map entries."""
    tables = {}
    for name, slices in model.embedding_tables.items():
        rows = tu.pb_to_indexed_rows(slices)
        order = np.argsort(rows.indices)
        tables[name] = (rows.indices[order].tolist(), rows.values[order].tolist())
    return {
        "version": model.version,
        "infos": sorted(
            (i.name, i.dim, i.initializer, i.dtype, i.vocabulary)
            for i in model.embedding_table_infos
        ),
        "dense": {k: tu.pb_to_ndarray(v).tolist() for k, v in model.dense_parameters.items()},
        "state": {k: tu.pb_to_ndarray(v).tolist() for k, v in model.state.items()},
        "tables": tables,
    }


def test_the_streamed_encoding_is_the_models():
    p = make_params(300, ps_id=1, num_ps=2)
    p.embedding_tables["empty"] = type(p.embedding_tables["emb"])("empty", 4, vocabulary=8)
    pieces, total = checkpoint.shard_pieces(p)
    data = b"".join(bytes(memoryview(x)) for x in pieces)
    assert len(data) == total
    assert as_dict(pb.Model.FromString(data)) == as_dict(p.to_model_pb())


def test_a_shard_protobuf_cannot_read_back_is_refused(monkeypatch):
    monkeypatch.setattr(checkpoint, "MAX_SHARD_BYTES", 1000)
    with pytest.raises(checkpoint.CheckpointError, match="more PS"):
        checkpoint.shard_pieces(make_params(100))


def test_the_file_holds_the_snapshot_while_the_ps_changes_its_memory(tmp_path):
    # Large enough that the child is still writing when the parent changes the last rows.
    rows = 200_000
    p = make_params(rows)
    expected = as_dict(p.to_model_pb())
    writer = SnapshotWriter(0, 1)
    assert writer.start(p, str(tmp_path))
    table = p.embedding_tables["emb"]
    table.values[-1000:] = -1.0  # right after the fork, before the child gets there
    table.slot("v")[-1000:] = -1.0
    p.dense["w"][:] = -1.0
    p.state["bn/mean"][:] = -1.0
    p.version = 11
    assert writer.wait(timeout=120)
    assert writer.last.ok, writer.last.error
    assert writer.last.overhead_bytes > 0  # the pages changed meanwhile were copied
    saved = checkpoint.restore(str(tmp_path), 0, 1)
    assert saved.version == 10
    assert as_dict(saved) == expected


def stop_after_first_chunk(monkeypatch):
    """The child stops itself once part of the file is written (a test hook: the chunk
    generator is replaced before the fork, so the child runs this one)."""
    chunks = snapshot_writer._chunks

    def stopping(pieces, parent):
        for i, chunk in enumerate(chunks(pieces, parent)):
            yield chunk
            if i == 0:
                os.kill(os.getpid(), signal.SIGSTOP)

    monkeypatch.setattr(snapshot_writer, "_chunks", stopping)
    monkeypatch.setattr(snapshot_writer, "CHUNK_BYTES", 1 << 20)


def wait_stopped(pid: int) -> None:
    deadline = time.monotonic() + 60
    while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, "the writer never stopped"
        time.sleep(0.01)


def temp_files(directory) -> list[str]:
    return [
        os.path.join(root, n)
        for root, _, names in os.walk(directory)
        for n in names
        if n.endswith(".tmp")
    ]


def test_one_write_at_a_time_and_a_killed_writer_keeps_the_previous_checkpoint(
    tmp_path, monkeypatch
):
    ckpt = tmp_path / "ckpt"
    p = make_params(50_000, version=10)
    saver = Checkpointer(CheckpointConfig(str(ckpt), 10, 0), ps_id=0, num_ps=1)
    assert saver.save_periodic(p) == STARTED
    saver.flush()
    previous = as_dict(checkpoint.restore(str(ckpt), 0, 1))

    stop_after_first_chunk(monkeypatch)
    p.version = 20
    p.embedding_tables["emb"].values[:] = 5.0
    assert saver.save_periodic(p) == STARTED
    pid = saver._writer._pid
    wait_stopped(pid)
    assert temp_files(ckpt), "the writer stopped before writing"
    p.version = 30
    assert saver.save_periodic(p) == SKIPPED and saver.skipped == 1

    os.kill(pid, signal.SIGKILL)
    saver.flush()
    failed = saver.written[-1]
    assert not failed.ok and failed.version == 20
    assert "killed by signal 9" in failed.error
    assert temp_files(ckpt) == []
    assert not (ckpt / "version-20").exists()
    assert [v for v, _ in checkpoint.list_version_dirs(str(ckpt))] == [10]
    assert as_dict(checkpoint.restore(str(ckpt), 0, 1)) == previous
    saver.close()


PS_THAT_DIES = textwrap.dedent(
    """
    import os, signal, sys
    sys.path[:0] = {paths!r}
    from elasticdl.ps import snapshot_writer
    from elasticdl.ps.snapshot_writer_test import make_params
    chunks = snapshot_writer._chunks
    def stopping(pieces, parent):
        for i, chunk in enumerate(chunks(pieces, parent)):
            yield chunk
            if i == 0:
                os.kill(os.getpid(), signal.SIGSTOP)
    snapshot_writer._chunks = stopping
    snapshot_writer.CHUNK_BYTES = 1 << 20
    writer = snapshot_writer.SnapshotWriter(0, 1)
    writer.start(make_params(50_000, version=20), {directory!r})
    print(writer._pid, flush=True)
    signal.pause()
    """
)


def test_a_writer_whose_ps_died_removes_its_file(tmp_path):
    ckpt = tmp_path / "ckpt"
    checkpoint.save_shard(make_params(10, version=10).to_model_pb(), str(ckpt), 0, 1)
    script = PS_THAT_DIES.format(paths=sys.path, directory=str(ckpt))
    ps = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child = int(ps.stdout.readline())
        wait_stopped(child)
        assert temp_files(ckpt)
    finally:
        ps.kill()
        ps.wait()
    os.kill(child, signal.SIGCONT)  # it finds its PS gone at its next piece
    deadline = time.monotonic() + 60
    while os.path.exists(f"/proc/{child}") and "Z" not in _state(child):
        assert time.monotonic() < deadline, "the orphaned writer did not exit"
        time.sleep(0.05)
    assert temp_files(ckpt) == []
    assert [v for v, _ in checkpoint.list_version_dirs(str(ckpt), valid_only=False)] == [10]


def _state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_without_fork_the_snapshot_is_copied_under_the_lock(tmp_path, monkeypatch, caplog):
    def no_fork():
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(os, "fork", no_fork)
    saver = Checkpointer(CheckpointConfig(str(tmp_path), 10, 0), ps_id=0, num_ps=1)
    p = make_params(100)
    assert saver.save_periodic(p) == COPIED
    saver.flush()
    assert "cannot fork a checkpoint writer" in caplog.text
    assert as_dict(checkpoint.restore(str(tmp_path), 0, 1)) == as_dict(p.to_model_pb())
    saver.close()


def test_pushes_go_on_while_a_checkpoint_of_their_ps_is_written(tmp_path, monkeypatch):
    """Through the PS's own hook: while the writer of version 5 is stopped half-way through
    its file, pushes are still served (a save under the model lock would hold them until the
    write ended), and the file, once the writer goes on, holds version 5 whole."""
    stop_after_first_chunk(monkeypatch)
    p = make_params(100_000, version=0)
    saver = Checkpointer(CheckpointConfig(str(tmp_path), 5, 0), ps_id=0, num_ps=1)

    def on_version(version):
        if saver.due(version):
            saver.save_periodic(p)

    ps = ParameterServer(
        p, Optimizer(parse_optimizer_config("SGD", "learning_rate=0.1")), on_version=on_version
    )

    def push():
        request = pb.PushGradientsRequest(gradients=pb.Model(version=p.version))
        rows = tu.IndexedRows(np.ones((10, DIM), np.float32), np.arange(10, dtype=np.int64))
        tu.indexed_rows_to_pb(rows, request.gradients.embedding_tables["emb"])
        assert ps.push_gradients(request).accepted

    for _ in range(5):
        push()
    at_five = as_dict(p.to_model_pb())
    pid = saver._writer._pid
    wait_stopped(pid)
    assert temp_files(tmp_path), "the writer stopped before writing"
    pushed = threading.Thread(target=lambda: [push() for _ in range(3)], daemon=True)
    pushed.start()
    pushed.join(HANG_GUARD_S)
    try:
        assert not pushed.is_alive(), "pushes waited for the checkpoint being written"
        assert p.version == 8 and saver._writer._pid == pid  # served while it still writes
    finally:
        os.kill(pid, signal.SIGCONT)
    saver.flush()
    assert as_dict(checkpoint.restore(str(tmp_path / "version-5"), 0, 1)) == at_five
    saver.close()
