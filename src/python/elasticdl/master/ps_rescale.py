"""Changing the number of parameter servers while a job runs (``elasticdl scale-ps``).

One change, run on a thread of its own so the master keeps serving:

1. **Pause**: the task manager hands out no task (workers get WAIT) until every task in
   flight is reported; a worker reports a training task only after its last push was
   answered, so the PS then hold every update of every reported task and nothing else. A
   worker lost meanwhile has its tasks re-queued as always: every record is still trained
   once.
2. **Snapshot**: every PS writes its shard to the job's checkpoint directory with the
   ``save_checkpoint`` RPC, all at one model version (a PS whose version lags is written at
   the others', ``as_version``), so the snapshot is one complete checkpoint version.
3. **Swap**: the old PS are stopped, then PS ``0..N-1`` are launched for ``N`` PS; each
   restores from the newest checkpoint, that snapshot, keeping what it owns under the new
   count (``elasticdl.ps.checkpoint``: dense parameters by name hash, rows by ``id % N``,
   optimizer slots with them, the model version). The change is journaled
   (``PSSetChanged``) so a restarted master knows the PS count.
4. **Resume**: once every new PS answers, tasks are handed out again, each stamped with the
   new PS set's generation and addresses (``Task.ps_generation``, ``Task.ps_addrs``): a
   worker rebuilds its PS client before the first task of a new generation, in-process.

The pause (first task held back to first task handed out after) and its parts are logged and
kept for the job status (``ps_scaling``). What bounds it: the longest task in flight (drain),
the shard write (snapshot), a PS process start and checkpoint read (swap).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Callable, Sequence

from elasticdl.master.journal_ops import PSSetChanged
from elasticdl.proto import elasticdl_pb2 as pb

logger = logging.getLogger(__name__)

# How long the swap may take before the change is given up (a PS that does not come up).
SWAP_TIMEOUT_S = 300.0
# How often the pause checks whether the tasks in flight have drained.
DRAIN_POLL_S = 0.02


class RescaleRefused(ValueError):
    """The change cannot be made as asked; the message names the field and the fix."""


@dataclasses.dataclass
class PSChange:
    """One change of the PS set, as the job status shows it (seconds)."""

    generation: int
    from_ps: int
    to_ps: int
    state: str = "draining"  # draining | snapshot | swapping | done | failed
    version: int = 0
    drain_s: float = 0.0
    snapshot_s: float = 0.0
    swap_s: float = 0.0
    pause_s: float = 0.0
    error: str = ""

    def to_dict(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in vars(self).items()}

    @property
    def accepted_message(self) -> str:
        """The one-line answer to the request that started this change."""
        return (
            f"changing the PS count {self.from_ps} -> {self.to_ps}: training pauses until the "
            "new PS serve; see 'elasticdl status'"
        )


def ask(rescaler: "PSRescaler | None", num_ps: int) -> PSChange:
    """A scale-ps request, however it came (the master's RPC, the master pod's annotation):
    the change started, or ``RescaleRefused``. ``rescaler`` None: a job without PS."""
    if rescaler is None:
        raise RescaleRefused(
            "this job has no parameter servers to scale: scale-ps is for training jobs "
            "with --distribution_strategy=ParameterServerStrategy"
        )
    return rescaler.request(num_ps)


class PSOps:
    """What a change asks of the PS and the replicas; the master's job wires the real ones."""

    def __init__(
        self,
        save_shard: Callable[[str, int], int],
        wait_ready: Callable[[str, float], None],
        replace_ps_set: Callable[[int, PSSetChanged], None],
    ) -> None:
        """``save_shard(address, as_version)``: the PS at ``address`` writes its shard to the
        job's checkpoint directory (as ``as_version`` unless 0) and returns the version;
        ``wait_ready(address, timeout)``: until the PS at ``address`` answers;
        ``replace_ps_set(num_ps, op)``: stop the old PS, journal ``op``, launch the new."""
        self.save_shard = save_shard
        self.wait_ready = wait_ready
        self.replace_ps_set = replace_ps_set


class PSRescaler:
    def __init__(
        self,
        task_manager,
        ps_ops: PSOps,
        addrs_of: Callable[[int], Sequence[str]],
        set_generation: Callable[[int, int], None],
        num_ps: int,
        refuse_reason: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``addrs_of(num_ps)``: the addresses of PS ``0..num_ps-1``; ``set_generation(g,
        n)``: replicas launched from now on belong to PS set ``g`` of ``n`` PS;
        ``refuse_reason``: why this job's PS count cannot change at all ("" : it can)."""
        self._tm = task_manager
        self._ops = ps_ops
        self._addrs_of = addrs_of
        self._set_generation = set_generation
        self._refuse_reason = refuse_reason
        self._clock = clock
        self._lock = threading.Lock()
        self.num_ps = num_ps
        self.generation = 0
        self._addrs: tuple[str, ...] = ()  # stamped on tasks once generation > 0
        self.changes: list[PSChange] = []
        self._thread: threading.Thread | None = None

    # ---- what workers are told -------------------------------------------------------------
    def stamp(self, task: pb.Task) -> pb.Task:
        """Mark a task handed out with the current PS set (nothing for the job's first set,
        which every worker was started with)."""
        if task.task_id and self.generation:
            task.ps_generation = self.generation
            task.ps_addrs.extend(self._addrs)
        return task

    # ---- a change --------------------------------------------------------------------------
    def request(self, num_ps: int) -> PSChange:
        """Start changing to ``num_ps`` PS; raises ``RescaleRefused`` (one line) when it
        cannot be done now or at all."""
        if self._refuse_reason:
            raise RescaleRefused(self._refuse_reason)
        if num_ps < 1:
            raise RescaleRefused(f"num_ps must be >= 1, got {num_ps}; ask for 1 PS or more")
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                raise RescaleRefused(
                    f"the PS count is being changed to {self.changes[-1].to_ps} already; "
                    "wait until 'elasticdl status' shows it done, then ask again"
                )
            if num_ps == self.num_ps:
                raise RescaleRefused(f"the job runs {num_ps} PS already; ask for another num_ps")
            if self._tm.finished:
                raise RescaleRefused("the job has no work left; there is nothing to re-shard for")
            change = PSChange(self.generation + 1, self.num_ps, num_ps)
            self.changes.append(change)
            self._thread = threading.Thread(
                target=self._run, args=(change,), name="ps-rescale", daemon=True
            )
            self._thread.start()
        return change

    def wait(self, timeout: float | None = None) -> bool:
        """Until the change under way (if any) ended; False after ``timeout``."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def _run(self, change: PSChange) -> None:
        started = self._clock()
        self._tm.hold()
        logger.info(
            "Changing the PS count %d -> %d: task dispatch paused until the tasks in flight "
            "are reported",
            change.from_ps,
            change.to_ps,
        )
        swapped = False
        try:
            if not self._drain(change):
                return
            change.drain_s = self._clock() - started
            change.state = "snapshot"
            change.version = self._snapshot(self._addrs_of(change.from_ps))
            change.snapshot_s = self._clock() - started - change.drain_s
            change.state = "swapping"
            self._set_generation(change.generation, change.to_ps)
            swapped = True
            self._ops.replace_ps_set(
                change.to_ps, PSSetChanged(change.generation, change.to_ps, change.version)
            )
            addrs = tuple(self._addrs_of(change.to_ps))
            deadline = self._clock() + SWAP_TIMEOUT_S
            for addr in addrs:
                self._ops.wait_ready(addr, max(1.0, deadline - self._clock()))
            with self._lock:
                self.generation, self.num_ps, self._addrs = change.generation, change.to_ps, addrs
            change.swap_s = self._clock() - started - change.drain_s - change.snapshot_s
            change.state = "done"
        except Exception as e:  # noqa: BLE001 - one line in the status and the log
            change.state, change.error = "failed", f"{type(e).__name__}: {e}"
            logger.error(
                "Changing the PS count %d -> %d failed: %s", change.from_ps, change.to_ps, e
            )
            if swapped:
                # The old PS are gone and the new ones did not come up: no PS to train with.
                self._tm.fail(f"changing the PS count to {change.to_ps} failed: {change.error}")
        finally:
            change.pause_s = self._clock() - started
            self._tm.release()
        if change.state == "done":
            logger.info(
                "PS count %d -> %d (PS set %d, model version %d): training paused %.2f s "
                "(drain %.2f s, snapshot %.2f s, swap %.2f s)",
                change.from_ps,
                change.to_ps,
                change.generation,
                change.version,
                change.pause_s,
                change.drain_s,
                change.snapshot_s,
                change.swap_s,
            )

    def _drain(self, change: PSChange) -> bool:
        while self._tm.in_flight():
            if self._tm.finished or self._tm.failed_message:
                break
            time.sleep(DRAIN_POLL_S)
        if self._tm.finished or self._tm.failed_message:
            change.state = "failed"
            change.error = "the job ended before the PS count changed"
            logger.warning("PS count not changed: the job ended first")
            return False
        return True

    def _snapshot(self, addrs: Sequence[str]) -> int:
        """Every PS's shard at one model version; returns it."""
        versions = [self._ops.save_shard(addr, 0) for addr in addrs]
        target = max(versions)
        for addr, version in zip(addrs, versions):
            if version != target:
                logger.info(
                    "PS at %s is at version %d: its shard written as %d", addr, version, target
                )
                self._ops.save_shard(addr, target)
        return target

    # ---- status / a restarted master ---------------------------------------------------------
    def status(self) -> dict:
        with self._lock:
            return {
                "num_ps": self.num_ps,
                "generation": self.generation,
                "changes": [c.to_dict() for c in self.changes[-10:]],
            }

    def restore(self, generation: int, num_ps: int) -> None:
        """A restarted master: the journal says the job runs PS set ``generation`` of
        ``num_ps`` PS."""
        self._set_generation(generation, num_ps)
        with self._lock:
            self.generation, self.num_ps = generation, num_ps
            self._addrs = tuple(self._addrs_of(num_ps)) if generation else ()
        logger.info(
            "PS set %d of %d PS (journaled by a previous master): the tasks handed out say so",
            generation,
            num_ps,
        )
