"""A checkpoint directory that fills up, on a real (small) tmpfs: the failed save is one clear
line, the previous complete checkpoint stays whole and readable, nothing half-written is left,
and saves work again once there is space.

Mounting the tmpfs needs root: elsewhere the tests skip with the reason, except where
ELASTICDL_REQUIRE_TMPFS is set (scripts/run-tests.sh under CI), where that is a failure."""
import logging
import os

import numpy as np
import pytest
from elasticdl.common import tensor_utils as tu
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.ps import checkpoint
from elasticdl.ps.checkpointer import CheckpointConfig, Checkpointer, CheckpointWriteError
from elasticdl_testing.tmpfs import TmpfsUnavailable, fill, mounted_tmpfs

ROWS = 64 * 1024  # 256 KiB of float32: a save needs real space
REQUIRE_ENV = "ELASTICDL_REQUIRE_TMPFS"


@pytest.fixture
def small_disk(tmp_path):
    try:
        with mounted_tmpfs(tmp_path, 4 * 1024 * 1024) as mount_point:
            yield mount_point
    except TmpfsUnavailable as e:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{e} ({REQUIRE_ENV} is set)", pytrace=False)
        pytest.skip(str(e))


def model(version: int, value: float = 1.0) -> pb.Model:
    m = pb.Model(version=version)
    tu.ndarray_to_pb(np.full((ROWS,), value, np.float32), m.dense_parameters["w"])
    return m


def leftovers(directory) -> list[str]:
    """Temporary or partial files anywhere under the checkpoint directory."""
    return [
        os.path.join(root, n)
        for root, _, names in os.walk(directory)
        for n in names
        if n.endswith(".tmp")
    ]


def test_full_disk_fails_in_one_line_and_keeps_the_previous_checkpoint(small_disk):
    ckpt = small_disk / "ckpt"
    saver = Checkpointer(CheckpointConfig(str(ckpt), 10, 2), ps_id=0, num_ps=1)
    saver.save(model(10, 1.0))
    filler = fill(small_disk)

    with pytest.raises(CheckpointWriteError) as failed:
        saver.save(model(20, 2.0))
    message = str(failed.value)
    assert "\n" not in message
    assert "no space left" in message and "version 20" in message, message
    assert str(ckpt / "version-10") in message, message
    # The previous checkpoint is whole and reads back; nothing of version 20 remains.
    assert [v for v, _ in checkpoint.list_version_dirs(str(ckpt), valid_only=False)] == [10]
    restored = checkpoint.restore(str(ckpt), 0, 1)
    assert restored.version == 10
    assert tu.pb_to_ndarray(restored.dense_parameters["w"])[0] == 1.0
    assert leftovers(ckpt) == []

    # Space again: the next due version is written and becomes the newest.
    filler.unlink()
    saver.save(model(30, 3.0))
    assert checkpoint.restore(str(ckpt), 0, 1).version == 30
    saver.close()


def test_background_save_on_a_full_disk_logs_one_line_and_the_next_one_works(small_disk, caplog):
    ckpt = small_disk / "ckpt"
    saver = Checkpointer(CheckpointConfig(str(ckpt), 10, 0), ps_id=3, num_ps=4)
    filler = fill(small_disk)
    with caplog.at_level(logging.ERROR, logger="elasticdl.ps.checkpointer"):
        future = saver.save_async(model(10))
        with pytest.raises(CheckpointWriteError):
            future.result(timeout=30)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is None, errors
    line = errors[0].getMessage()
    assert "\n" not in line and "PS 3" in line and "(none yet)" in line, line
    assert "training goes on" in line, line
    assert checkpoint.list_version_dirs(str(ckpt), valid_only=False) == []

    filler.unlink()
    assert saver.save_async(model(20)).result(timeout=30).endswith("variables-3-of-4.ckpt")
    saver.close()


def test_a_version_another_ps_could_not_complete_frees_its_space(small_disk):
    """Two PS: PS 0 writes its shard of version 20, then the disk is full for PS 1. The
    version can never be complete, so PS 0's shard of it goes too (it would hold space the
    next checkpoints need); version 10, complete, stays."""
    ckpt = small_disk / "ckpt"
    ps0 = Checkpointer(CheckpointConfig(str(ckpt), 10, 0), ps_id=0, num_ps=2)
    ps1 = Checkpointer(CheckpointConfig(str(ckpt), 10, 0), ps_id=1, num_ps=2)
    ps0.save(model(10))
    ps1.save(model(10))
    ps0.save(model(20))
    fill(small_disk)
    with pytest.raises(CheckpointWriteError):
        ps1.save(model(20))
    assert [v for v, _ in checkpoint.list_version_dirs(str(ckpt), valid_only=False)] == [10]
    assert checkpoint.is_valid_version_dir(str(ckpt / "version-10"))
    assert leftovers(ckpt) == []
    ps0.close()
    ps1.close()
