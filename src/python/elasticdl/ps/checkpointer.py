"""When and where one PS writes its checkpoint shard.

Periodic saves (every `checkpoint_steps` versions) take a consistent snapshot while the model
lock is held (the caller holds it), then serialize and write it on a background thread, so
gradient pushes do not wait for the disk. Explicit saves (the save_checkpoint RPC, shutdown)
are synchronous.

A save that the disk refuses (full, quota, read-only) fails in one line naming the directory
and the newest complete checkpoint, which stays as it was (shard files are renamed into place
only once whole); a periodic save that fails is logged and training goes on, so the next due
version tries again.
"""
from __future__ import annotations

import errno
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.ps import checkpoint
from elasticdl.ps.errors import PSError

logger = logging.getLogger(__name__)


class CheckpointWriteError(PSError):
    """The checkpoint directory refused a write; the message is one line."""


def _write_failure(ps_id: int, version: int, directory: str, err: OSError) -> str:
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        cause, fix = (
            "no space left on the device",
            "free space there or choose another --checkpoint_dir",
        )
    else:
        cause, fix = err.strerror or str(err), "check --checkpoint_dir"
    latest = checkpoint.get_latest_valid_version_dir(directory)
    return (
        f"PS {ps_id} did not write checkpoint version {version} to {directory}: {cause}; "
        f"the newest complete checkpoint {latest or '(none yet)'} is kept; {fix}"
    )


@dataclass
class CheckpointConfig:
    checkpoint_dir: str = ""
    checkpoint_steps: int = 0  # 0: no periodic checkpoints
    keep_checkpoint_max: int = 0  # 0: keep all

    def __post_init__(self):
        if self.checkpoint_steps < 0:
            raise PSError(f"--checkpoint_steps must be >= 0, got {self.checkpoint_steps}")
        if self.keep_checkpoint_max < 0:
            raise PSError(f"--keep_checkpoint_max must be >= 0, got {self.keep_checkpoint_max}")
        if self.checkpoint_steps and not self.checkpoint_dir:
            raise PSError("--checkpoint_steps needs --checkpoint_dir (where to write)")


class Checkpointer:
    def __init__(self, config: CheckpointConfig, ps_id: int, num_ps: int):
        self.config = config
        self.ps_id = ps_id
        self.num_ps = num_ps
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ps-checkpoint")
        self._pending: list[Future] = []

    def due(self, version: int) -> bool:
        steps = self.config.checkpoint_steps
        return bool(steps) and version > 0 and version % steps == 0

    def save(self, model: pb.Model, checkpoint_dir: str | None = None) -> str:
        """Write `model` now; returns the file path."""
        directory = checkpoint_dir or self.config.checkpoint_dir
        if not directory:
            raise PSError(
                "no checkpoint directory: pass one in the request or start the PS "
                "with --checkpoint_dir"
            )
        try:
            path = checkpoint.save_shard(
                model, directory, self.ps_id, self.num_ps, self.config.keep_checkpoint_max
            )
        except OSError as e:
            raise CheckpointWriteError(
                _write_failure(self.ps_id, model.version, directory, e)
            ) from None
        logger.info("PS %d saved checkpoint version %d to %s", self.ps_id, model.version, path)
        return path

    def save_async(self, model: pb.Model) -> Future:
        def run():
            try:
                return self.save(model)
            except CheckpointWriteError as e:
                logger.error("%s; training goes on", e)
                raise
            except Exception:
                logger.exception(
                    "PS %d failed to save checkpoint version %d", self.ps_id, model.version
                )
                raise

        self._pending = [f for f in self._pending if not f.done()]
        future = self._executor.submit(run)
        self._pending.append(future)
        return future

    def flush(self) -> None:
        """Wait for background saves to finish (errors were logged already)."""
        for f in list(self._pending):
            try:
                f.result()
            except Exception:
                pass
        self._pending.clear()

    def close(self) -> None:
        self.flush()
        self._executor.shutdown(wait=True)
