"""Which PS set a worker trains through, and moving to a new one when the job's PS count changed.

The master stamps every task it hands out after a change of the PS count with the new set's
generation and addresses (``Task.ps_generation``, ``Task.ps_addrs``; see
``elasticdl.master.ps_rescale``). Before running such a task the worker builds a PS client for
the new set and hands it to its trainer, which pulls the model from it; the old client is
dropped without calling the old PS (they are gone). No task of the old set is outstanding by
then: the master handed out none while it changed the set, so the worker is not restarted.
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

from elasticdl.proto import elasticdl_pb2 as pb

logger = logging.getLogger(__name__)


class PSSet:
    def __init__(self, trainer, connect: Callable[[Sequence[str]], object]) -> None:
        """``trainer``: has ``replace_ps_client(client) -> old client``; ``connect(addrs)``: a
        PS client for the PS at ``addrs`` (built as the worker's first one was)."""
        self._trainer = trainer
        self._connect = connect
        self.generation = 0  # the set the worker was started with
        self.clients: list = []  # clients made here, closed with the worker

    def follow(self, task: pb.Task) -> bool:
        """Move to the task's PS set when it is newer than the worker's; True if it moved."""
        if task.ps_generation <= self.generation or not task.ps_addrs:
            return False
        addrs = list(task.ps_addrs)
        logger.info(
            "PS set %d -> %d: training through %d PS at %s",
            self.generation,
            task.ps_generation,
            len(addrs),
            ", ".join(addrs),
        )
        client = self._connect(addrs)
        old = self._trainer.replace_ps_client(client)
        self.clients.append(client)
        self.generation = task.ps_generation
        old.drop()
        return True
