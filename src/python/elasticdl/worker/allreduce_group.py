"""A worker's place in the AllReduce communication group of an elastic job.

The master's rendezvous (``elasticdl.master.rendezvous``) decides membership per *generation*;
this module turns one generation into a ``torch.distributed`` process group (Gloo on CPU, NCCL
when CUDA is available) built through the master's TCPStore under that generation's key prefix,
and throws it away when the generation ends. Process groups are created directly (not through
``init_process_group``), so nothing global survives a generation and re-initialising after a
peer died never touches a half-dead default group.

Why torch.distributed and not Horovod (the original): Horovod's last release does not build
against current TensorFlow, while torch ships Gloo and NCCL prebuilt; the collectives here only
move flat numpy buffers, so the framework of the model (TensorFlow) does not matter.

torch is imported lazily, when a group is built: nothing in the parameter-server path loads it.
"""
from __future__ import annotations

import datetime
import logging
import socket
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
from elasticdl.common.allreduce_keys import group_store_prefix
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.worker.master_client import MasterClient

logger = logging.getLogger(__name__)


class CollectiveError(RuntimeError):
    """A collective operation failed (a peer died or hung); the group must be rebuilt."""


class RendezvousTimeoutError(RuntimeError):
    """The master did not put this worker into a generation in time."""


@dataclass
class GroupConfig:
    # "gloo", "nccl", or "auto": NCCL when every member of a generation has a GPU of its own
    # (NCCL refuses two ranks on one device), else Gloo; decided anew per generation.
    backend: str = "auto"
    # Also bounds how long the others wait while one member runs an evaluation/export task, and
    # how long building a group waits for a member that died meanwhile.
    collective_timeout_s: float = 120.0
    # While a Gloo collective waits: how often to ask the master whether a member left.
    watch_interval_s: float = 2.0
    join_timeout_s: float = 600.0
    poll_interval_s: float = 0.2
    # The job's secret: the store's keys are named after it (see elasticdl.common.allreduce_keys).
    secret: str = ""

    def __post_init__(self) -> None:
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ValueError(f"allreduce backend must be auto, gloo or nccl, got {self.backend!r}")


class AllreduceMasterClient(MasterClient):
    """The master client plus the rendezvous RPCs."""

    def get_comm_rank(self, worker_host: str = "") -> pb.GetCommRankResponse:
        return self._call(
            "get_comm_rank",
            pb.GetCommRankRequest(worker_host=worker_host, worker_id=self.worker_id),
        )

    def report_training_loop_status(
        self, status: int, rendezvous_id: int = 0, worker_host: str = ""
    ) -> None:
        self._call(
            "report_training_loop_status",
            pb.ReportTrainingLoopStatusRequest(
                worker_host=worker_host,
                worker_id=self.worker_id,
                status=status,
                rendezvous_id=rendezvous_id,
            ),
        )

    def report_version(self, model_version: int) -> None:
        self._call("report_version", pb.ReportVersionRequest(model_version=int(model_version)))


def local_address_towards(addr: str) -> str:
    """This host's address on the route to ``addr`` (host:port): the address peers reach us at
    (127.0.0.1 for a local job, the pod IP on Kubernetes). No packet is sent."""
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, int(port or 1)))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


class CommGroup:
    """Membership plus the process group of the current generation."""

    def __init__(self, master: AllreduceMasterClient, config: Optional[GroupConfig] = None):
        self.master = master
        self.config = config or GroupConfig()
        self.host = local_address_towards(master.addr)
        self.rank = -1
        self.world_size = 0
        self.rendezvous_id = 0  # generation of the live group (0: none)
        self._last_generation = 0  # newest generation this worker took part in
        self._pg = None
        self._store = None
        self._store_addr = None
        self._device = None
        self._backend = ""  # the live group's: "nccl" or "gloo"
        self._joined = False  # reported LOOP_START at least once
        self._must_rejoin = True  # next join reports LOOP_START(0) (first time / after failure)

    # ---- membership ----------------------------------------------------------------------
    @property
    def is_member(self) -> bool:
        return self._pg is not None

    @property
    def joined(self) -> bool:
        """Reported LOOP_START and not left since."""
        return self._joined

    @property
    def uses_cuda(self) -> bool:
        return self._backend == "nccl"

    @property
    def backend(self) -> str:
        """The live group's backend ("nccl" or "gloo"; "" outside a group)."""
        return self._backend

    def _choose_backend(self, store, rank: int, world_size: int, generation: int) -> str:
        """The backend of a generation, the same on every member: each publishes the UUID of
        the GPU it would use and NCCL is chosen only if all members have one and no two share
        it (a local job's workers on one GPU, or more workers than GPUs, get Gloo).

        Every member publishing is also the generation's barrier, whatever the backend: the
        process group is built only once all members are there, and waiting for one that
        died before it published ends on the master's word, not after the whole timeout."""
        import torch

        gpu = ""
        if self.config.backend == "auto" and torch.cuda.is_available():
            gpu = str(torch.cuda.get_device_properties(0).uuid)
        store.set(f"gpu/{rank}", gpu or "-")
        keys = [f"gpu/{r}" for r in range(world_size)]
        self._wait_for_members(store, keys, generation)
        if self.config.backend != "auto":
            return self.config.backend
        gpus = [store.get(k).decode() for k in keys]
        return "nccl" if "-" not in gpus and len(set(gpus)) == len(gpus) else "gloo"

    def _wait_for_members(self, store, keys: list[str], generation: int) -> None:
        """``store.wait(keys)`` in slices of ``watch_interval_s``, asking the master in between
        whether generation ``generation`` is over (see :meth:`_generation_over`)."""
        slice_ = datetime.timedelta(seconds=self.config.watch_interval_s)
        deadline = time.monotonic() + self.config.collective_timeout_s
        while True:
            try:
                store.wait(keys, slice_)
                return
            except RuntimeError as err:  # DistStoreError: "wait timeout after ..."
                if "timeout" not in str(err) or time.monotonic() >= deadline:
                    raise
            self._raise_if_generation_over(generation)

    def _raise_if_generation_over(self, generation: int) -> None:
        """A member of ``generation`` left the job or the master formed a newer one: what this
        worker waits for in it cannot complete."""
        answer = self.master.get_comm_rank(self.host)
        if answer.members_gone or answer.rendezvous_id != generation:
            raise CollectiveError(
                f"generation {generation} is over (a member left the job, or the master "
                "formed a newer one): its collectives cannot complete"
            )

    def join(self) -> None:
        """Wait for a generation newer than the last one this worker was in that includes it,
        and build its process group. The caller then syncs state and calls :meth:`acknowledge`."""
        deadline = time.monotonic() + self.config.join_timeout_s
        if self._must_rejoin:
            self.master.report_training_loop_status(pb.LOOP_START, 0, self.host)
            self._joined = True
            self._must_rejoin = False
        while True:
            resp = self.master.get_comm_rank(self.host)
            if resp.rendezvous_id > self._last_generation:
                if resp.rank_id >= 0:
                    break
                # A generation formed without us (our join came late): ask again.
                self.master.report_training_loop_status(pb.LOOP_START, 0, self.host)
            if time.monotonic() > deadline:
                raise RendezvousTimeoutError(
                    f"no rendezvous generation after {self._last_generation} included worker "
                    f"{self.master.worker_id} within {self.config.join_timeout_s:.0f}s"
                )
            time.sleep(self.config.poll_interval_s)
        self._last_generation = resp.rendezvous_id
        try:
            self._build(resp)
        except Exception as err:
            self.drop(failed=True)
            raise CollectiveError(
                f"building the group of generation {resp.rendezvous_id} failed: {err}"
            ) from err

    def _build(self, resp: pb.GetCommRankResponse) -> None:
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=self.config.collective_timeout_s)
        addr = (resp.rendezvous_addr or self.master.addr.rpartition(":")[0], resp.rendezvous_port)
        if self._store is None or self._store_addr != addr:
            self._store = dist.TCPStore(
                addr[0],
                addr[1],
                is_master=False,
                timeout=datetime.timedelta(seconds=self.config.join_timeout_s),
            )
            self._store_addr = addr
        prefix = group_store_prefix(resp.rendezvous_id, self.config.secret)
        store = dist.PrefixStore(prefix, self._store)
        started = time.monotonic()
        self._backend = self._choose_backend(
            store, resp.rank_id, resp.world_size, resp.rendezvous_id
        )
        if self._backend == "nccl":
            self._pg = dist.ProcessGroupNCCL(store, resp.rank_id, resp.world_size, timeout=timeout)
        else:
            if self._device is None:
                self._device = dist.ProcessGroupGloo.create_device(hostname=self.host)
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = timeout
            opts._devices = [self._device]
            self._pg = dist.ProcessGroupGloo(store, resp.rank_id, resp.world_size, opts)
        self.rank, self.world_size, self.rendezvous_id = (
            resp.rank_id,
            resp.world_size,
            resp.rendezvous_id,
        )
        logger.info(
            "Worker %d: rank %d of %d in rendezvous generation %d (%s, %.2fs)",
            self.master.worker_id,
            self.rank,
            self.world_size,
            self.rendezvous_id,
            self._backend,
            time.monotonic() - started,
        )

    def acknowledge(self) -> None:
        self.master.report_training_loop_status(pb.LOOP_START, self.rendezvous_id, self.host)

    def new_generation_available(self) -> bool:
        """Has the master formed a generation newer than ours (someone joined or left)?"""
        return self.master.get_comm_rank(self.host).rendezvous_id > self.rendezvous_id

    def drop(self, failed: bool) -> None:
        """Forget the group. ``failed``: it broke, so the next join asks for a new generation."""
        self._pg = None
        self._backend = ""
        self.rank, self.world_size, self.rendezvous_id = -1, 0, 0
        if failed:
            self._must_rejoin = True

    def leave(self) -> None:
        """Out for good (no more work): tell the master, forget the group."""
        self.drop(failed=False)
        if self._joined:
            self.master.report_training_loop_status(pb.LOOP_END, 0, self.host)
            self._joined = False

    # ---- collectives (in place, on numpy buffers) ----------------------------------------
    def _complete(self, work) -> None:
        """Wait for a Gloo collective, asking the master every ``watch_interval_s`` whether a
        member of this generation left the job: then it cannot complete (a peer on a lost node
        sends no reset, so Gloo would wait its whole timeout) and the group is dropped now."""
        slice_ = datetime.timedelta(seconds=self.config.watch_interval_s)
        deadline = time.monotonic() + self.config.collective_timeout_s
        while True:
            try:
                work.wait(slice_)
                return
            except RuntimeError as err:
                if "timed out" not in str(err) or time.monotonic() >= deadline:
                    raise
            self._raise_if_generation_over(self.rendezvous_id)

    def _run(self, what: str, fn) -> None:
        if self._pg is None:
            raise CollectiveError(f"{what}: not in a group")
        try:
            fn()
        except RuntimeError as err:  # Gloo/NCCL errors: peer died, timeout, ...
            raise CollectiveError(
                f"{what} in generation {self.rendezvous_id} failed: {err}"
            ) from err

    def allreduce_(self, array: np.ndarray) -> None:
        """Sum ``array`` over the group, in place (zero-copy on CPU: torch views the buffer)."""
        import torch

        def run():
            if self.uses_cuda:
                t = torch.from_numpy(array).cuda()
                self._pg.allreduce([t]).wait()
                array[...] = t.cpu().numpy()
            else:
                self._complete(self._pg.allreduce([torch.from_numpy(array)]))

        self._run("allreduce", run)

    def broadcast_(self, array: np.ndarray, root: int = 0) -> None:
        """Overwrite ``array`` with rank ``root``'s, in place."""
        import torch
        import torch.distributed as dist

        def run():
            opts = dist.BroadcastOptions()
            opts.rootRank, opts.rootTensor = root, 0
            if self.uses_cuda:
                t = torch.from_numpy(array).cuda()
                self._pg.broadcast([t], opts).wait()
                array[...] = t.cpu().numpy()
            else:
                self._complete(self._pg.broadcast([torch.from_numpy(array)], opts))

        self._run("broadcast", run)
