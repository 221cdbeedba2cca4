"""When and where one PS writes its checkpoint shard.

Periodic saves (every `checkpoint_steps` versions) must not stop training: the PS's copy-on-
write snapshot is written by a forked child (`elasticdl.ps.snapshot_writer`), so gradient pushes
wait only for the fork. One write runs at a time; a save due meanwhile is skipped (the next
due version is written). Where the child cannot be made, the snapshot is a copy taken under
the model lock instead, written on a background thread. Explicit saves (the save_checkpoint
RPC) are synchronous.

A save that the disk refuses (full, quota, read-only) fails in one line naming the directory
and the newest complete checkpoint, which stays as it was (shard files are renamed into place
only once whole); a periodic save that fails is logged and training goes on, so the next due
version tries again.
"""
from __future__ import annotations

import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.ps import checkpoint
from elasticdl.ps.errors import PSError
from elasticdl.ps.parameters import Parameters
from elasticdl.ps.snapshot_writer import SnapshotWriter, WriteResult

logger = logging.getLogger(__name__)

# Background saves: what `Checkpointer.save_periodic` did with a due version.
STARTED, SKIPPED, COPIED = "started", "skipped", "copied"


class CheckpointWriteError(PSError):
    """The checkpoint directory refused a write; the message is one line."""


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
    def __init__(
        self, config: CheckpointConfig, ps_id: int, num_ps: int, copy_on_write: bool = True
    ):
        """``copy_on_write``: periodic saves from a forked child (else: a copy under the lock,
        written on a thread, as where fork is not available)."""
        self.config = config
        self.ps_id = ps_id
        self.num_ps = num_ps
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ps-checkpoint")
        self._pending: list[Future] = []
        self._copy_on_write = copy_on_write and hasattr(os, "fork")
        self._writer = SnapshotWriter(
            ps_id, num_ps, config.keep_checkpoint_max, on_done=self._written
        )
        self._after_write: Callable[[], None] | None = None
        self.skipped = 0  # periodic saves skipped: the previous write still ran
        self.written: list[WriteResult] = []  # background writes, oldest first (the last 16)

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
                checkpoint.write_failure(self.ps_id, model.version, directory, e)
            ) from None
        logger.info("PS %d saved checkpoint version %d to %s", self.ps_id, model.version, path)
        return path

    def save_periodic(
        self, params: Parameters, after_write: Callable[[], None] | None = None
    ) -> str:
        """Checkpoint ``params`` at its current version without waiting for the disk; call
        with the model lock held. Returns STARTED (a child writes it), SKIPPED (the previous
        write still runs; ``after_write``, if given, is called once it ended) or COPIED (a
        copy taken now is written on a thread)."""
        if self._copy_on_write:
            try:
                if self._writer.start(params, self.config.checkpoint_dir):
                    return STARTED
            except OSError as e:
                self._copy_on_write = False
                logger.warning(
                    "PS %d cannot fork a checkpoint writer (%s): checkpoints are copied under "
                    "the model lock from now on",
                    self.ps_id,
                    e,
                )
            else:
                self.skipped += 1
                running = self._writer.last_started
                logger.info(
                    "PS %d skipped checkpoint version %d: version %d is still being written "
                    "(one write at a time)",
                    self.ps_id,
                    params.version,
                    running,
                )
                if after_write is not None:
                    self._after_write = after_write
                return SKIPPED
        self.save_async(params.to_model_pb())
        return COPIED

    def _written(self, result: WriteResult) -> None:
        self.written = (self.written + [result])[-16:]
        if result.ok:
            logger.info(
                "PS %d saved checkpoint version %d to %s in %.1f s; training waited %.1f ms "
                "for the snapshot, %.0f MiB copied while it was written",
                self.ps_id,
                result.version,
                result.path,
                result.write_s,
                result.blocked_s * 1e3,
                result.overhead_bytes / 2**20,
            )
        else:
            logger.error(
                "PS %d did not write checkpoint version %d: %s; training goes on",
                self.ps_id,
                result.version,
                result.error,
            )
        after, self._after_write = self._after_write, None
        if after is not None:
            after()

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
        self._writer.wait()
        for f in list(self._pending):
            try:
                f.result()
            except Exception:
                pass
        self._pending.clear()

    def close(self) -> None:
        self.flush()
        self._executor.shutdown(wait=True)
