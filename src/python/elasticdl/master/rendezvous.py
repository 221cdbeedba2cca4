"""Membership of the AllReduce communication group (``--distribution_strategy=AllreduceStrategy``).

The master decides who is in the group; the workers only ask. A *generation* (the
``rendezvous_id`` of the wire protocol) is one fixed membership: an ordered list of workers, the
position being the rank. Workers build their collective group (torch.distributed, Gloo) for one
generation at a time, through a key-value store the master hosts (:class:`RendezvousStore`):
every generation uses its own key prefix (``common.allreduce_keys``), so a group never meets
keys of an older one.

Rules (pure Python and thread-safe; torch is imported only by :class:`RendezvousStore`):

* **Join**: a worker reports ``LOOP_START`` without a generation (``rendezvous_id <= 0``) when it
  is ready to train (model built, data in hand). Joining on the worker's own report rather than
  on the platform's "Running" event keeps the group from waiting for a process that is still
  importing TensorFlow.
* **Leave**: ``LOOP_END`` from the worker, or any terminal event of the worker replica from the
  platform (exited, killed, deleted), whichever comes first.
* **Acknowledge**: after building its group for generation *g* a member reports ``LOOP_START``
  with ``rendezvous_id = g``. A member whose collective failed reports ``LOOP_START`` with
  ``rendezvous_id <= 0`` again: that both answers *g* and asks for a new generation.
* **New generation** only when the wanted membership differs from the current one (or a member
  asked for one), **every member of the current generation that is still wanted has answered
  it**, and no membership change happened for ``settle_s`` seconds (a burst of joins or a crash
  seen by several workers at once becomes one generation, not several). A member that never
  answers (frozen) is waited for at most ``answer_timeout_s``.
* **A member gone**: while a member of the current generation has left the job, every answer
  of ``get_comm_rank`` says so (``members_gone``): the others stop waiting in a collective that
  cannot complete and rejoin at once, instead of after the collective's timeout (a peer on a
  lost node sends no reset: nothing else tells them).
* Ranks follow joining order: survivors keep their relative order, newcomers come last, so rank
  0 - which broadcasts the model to everyone after a change - is the longest-serving member.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from typing import Callable

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CommRank:
    """What a worker learns from ``get_comm_rank``."""

    rank: int  # -1: not a member of the current generation (yet)
    world_size: int
    rendezvous_id: int  # 0 until the first generation exists
    store_host: str
    store_port: int
    members_gone: bool = False  # a member of this generation left the job


# Generation ids are life-major: the n-th master of a job (after n - 1 restarts) numbers its
# generations from n << 32, above any generation an earlier master formed.
_LIFE_SHIFT = 32


def generation_base(lives: int) -> int:
    """The generation a master starts from after ``lives`` earlier masters of its job."""
    return int(lives) << _LIFE_SHIFT


@dataclasses.dataclass
class RendezvousConfig:
    store_host: str = ""
    store_port: int = 0
    first_generation: int = 0  # generation_base(...): where this master's ids start
    settle_s: float = 1.0
    answer_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.settle_s < 0:
            raise ValueError(f"rendezvous settle_s must be >= 0, got {self.settle_s}")
        if self.answer_timeout_s <= 0:
            raise ValueError(
                f"rendezvous answer_timeout_s must be > 0, got {self.answer_timeout_s}"
            )


class Rendezvous:
    def __init__(
        self, config: RendezvousConfig | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config or RendezvousConfig()
        self._clock = clock
        self._lock = threading.Lock()
        self._generation = self.config.first_generation
        self._members: list[int] = []  # worker ids of the current generation, by rank
        self._answered: set[int] = set()  # members that answered the current generation
        self._wanted: "OrderedDict[int, str]" = OrderedDict()  # worker id -> host, joining order
        self._reform_requested = False
        self._last_change = clock()
        self._generation_formed_at = clock()
        self._gone: set[int] = set()  # workers that left for good; a late join is refused
        self.history: list[tuple[int, list[int]]] = []  # (generation, members by rank)

    # ---- worker reports ------------------------------------------------------------------
    def join(self, worker_id: int, host: str = "") -> None:
        """``LOOP_START`` without a generation: ready to train, or my collective failed."""
        with self._lock:
            if worker_id in self._gone:
                logger.warning(
                    "Rendezvous: join from worker %d ignored, it already left the job", worker_id
                )
                return
            if worker_id not in self._wanted:
                self._wanted[worker_id] = host
                self._last_change = self._clock()
                logger.info("Rendezvous: worker %d (%s) joins", worker_id, host or "?")
            if worker_id in self._members:
                # A member restarts its loop: its group is broken, everyone needs a new one.
                self._answered.add(worker_id)
                if not self._reform_requested:
                    self._reform_requested = True
                    self._last_change = self._clock()
                    logger.info(
                        "Rendezvous: worker %d left generation %d (collective failed); a new one "
                        "will be formed",
                        worker_id,
                        self._generation,
                    )

    def acknowledge(self, worker_id: int, rendezvous_id: int) -> None:
        """``LOOP_START`` with ``rendezvous_id``: the worker's group for that generation is up."""
        with self._lock:
            if rendezvous_id == self._generation and worker_id in self._members:
                self._answered.add(worker_id)
            else:
                logger.debug(
                    "Rendezvous: stale acknowledgement of generation %d from worker %d (current %d)",
                    rendezvous_id,
                    worker_id,
                    self._generation,
                )

    def leave(self, worker_id: int, reason: str = "") -> None:
        """``LOOP_END`` or the worker replica ended: it is out for good (a relaunched worker
        gets a new id)."""
        with self._lock:
            self._gone.add(worker_id)
            if self._wanted.pop(worker_id, None) is not None:
                self._last_change = self._clock()
                logger.info(
                    "Rendezvous: worker %d leaves%s", worker_id, f" ({reason})" if reason else ""
                )

    def on_replica_event(self, event) -> None:
        """Platform event listener: a worker replica that ended leaves the group."""
        from elasticdl.platform.base import ReplicaType

        if event.replica_type == ReplicaType.WORKER and event.phase.is_terminal:
            self.leave(event.replica_id, reason=f"{event.phase}, exit code {event.exit_code}")

    # ---- queries -------------------------------------------------------------------------
    def get_comm_rank(self, worker_id: int) -> CommRank:
        with self._lock:
            self._maybe_advance_locked()
            rank = self._members.index(worker_id) if worker_id in self._members else -1
            return CommRank(
                rank=rank,
                world_size=len(self._members),
                rendezvous_id=self._generation,
                store_host=self.config.store_host,
                store_port=self.config.store_port,
                members_gone=any(m in self._gone for m in self._members),
            )

    @property
    def generation(self) -> int:
        with self._lock:
            self._maybe_advance_locked()
            return self._generation

    def members(self) -> list[int]:
        with self._lock:
            self._maybe_advance_locked()
            return list(self._members)

    # ---- generations ---------------------------------------------------------------------
    def _changed_locked(self) -> bool:
        return self._reform_requested or list(self._wanted) != self._members

    def _maybe_advance_locked(self) -> None:
        if not self._changed_locked():
            return
        now = self._clock()
        if now - self._last_change < self.config.settle_s:
            return
        waiting = [m for m in self._members if m in self._wanted and m not in self._answered]
        if waiting:
            if now - self._generation_formed_at < self.config.answer_timeout_s:
                return
            logger.warning(
                "Rendezvous: workers %s did not answer generation %d within %.0f s; forming the "
                "next one without waiting",
                waiting,
                self._generation,
                self.config.answer_timeout_s,
            )
        self._generation += 1
        self._members = list(self._wanted)
        self._answered = set()
        self._reform_requested = False
        self._generation_formed_at = now
        self.history.append((self._generation, list(self._members)))
        logger.info(
            "Rendezvous: generation %d, world size %d, ranks %s",
            self._generation,
            len(self._members),
            {w: r for r, w in enumerate(self._members)},
        )


class RendezvousStore:
    """The ``torch.distributed.TCPStore`` through which workers build their Gloo/NCCL groups.

    Hosted by the master for the whole job (not by a worker, which may die): one store, one key
    prefix per generation. The listening socket is bound here, to ``bind_host`` only, and handed
    to torch; torch is imported lazily so PS jobs never load it.
    """

    def __init__(self, bind_host: str = "127.0.0.1", port: int = 0) -> None:
        import socket

        try:
            import torch.distributed as dist
        except ImportError as e:  # pragma: no cover - torch is a dependency of the package
            raise RuntimeError(
                "AllreduceStrategy needs PyTorch (torch.distributed, Gloo); install torch"
            ) from e
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((bind_host, port))
        except OSError as e:
            self._socket.close()
            raise RuntimeError(f"rendezvous store cannot listen on {bind_host}:{port}: {e}") from e
        self._socket.listen(1024)
        self.port = self._socket.getsockname()[1]
        self._store = dist.TCPStore(
            bind_host,
            self.port,
            is_master=True,
            wait_for_workers=False,
            master_listen_fd=self._socket.fileno(),
        )
        self._socket.detach()  # the store owns (and closes) the listening socket now
        logger.info("Rendezvous store (torch TCPStore) listening on %s:%d", bind_host, self.port)

    def close(self) -> None:
        self._store = None  # the server stops when the last reference goes
