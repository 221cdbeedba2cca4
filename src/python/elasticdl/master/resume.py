"""The journals of one job's master and what a restarted master reads back from them.

A master whose job directory already holds a journal of the same job spec is a restart (its
supervisor started it again after it died): it takes the previous master's port and secret,
replays the task manager, the evaluation service and the replica manager (see
``master.journal`` and their modules), and adopts the running replicas. The ``replicas``
journal begins each master's life with a ``master`` record (port, spec digest, pid), written
before anything else, so a journal without one holds nothing to resume.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

from elasticdl.common.job_dir import JOURNAL_DIR
from elasticdl.master.journal import Journal, JournalError
from elasticdl.master.journal_ops import REPLICA_OPS, MasterStarted, decode_all, encode


@dataclasses.dataclass
class PreviousLife:
    port: int
    lives: int  # masters of this job before this one
    tasks: tuple[dict | None, list[dict]]
    evaluation: tuple[dict | None, list[dict]]
    replicas: list[dict]


class JobJournal:
    def __init__(self, job_dir: str | os.PathLike, spec_json: str, fsync_interval_s=1.0) -> None:
        self.directory = Path(job_dir) / JOURNAL_DIR
        self.digest = hashlib.sha256(spec_json.encode()).hexdigest()
        self.tasks = Journal(self.directory, "tasks", fsync_interval_s=fsync_interval_s)
        self.evaluation = Journal(self.directory, "evaluation", fsync_interval_s=fsync_interval_s)
        self.replicas = Journal(
            self.directory, "replicas", fsync_interval_s=fsync_interval_s, compact_every=0
        )
        self.lives = 0

    def previous(self) -> PreviousLife | None:
        """What the previous masters of this job recorded, or None for a first start."""
        if not self.replicas.exists():
            return None
        _, records = self.replicas.replay()
        masters = [op for op in decode_all(records, REPLICA_OPS) if isinstance(op, MasterStarted)]
        if not masters:
            return None
        if masters[-1].spec_digest != self.digest:
            raise JournalError(
                f"{self.directory} holds the journal of another spec of this job; the master "
                "cannot resume it (submit the job again to start over)"
            )
        self.lives = len(masters)
        return PreviousLife(
            port=masters[-1].port,
            lives=len(masters),
            tasks=self.tasks.replay(),
            evaluation=self.evaluation.replay(),
            replicas=records,
        )

    def open(self, port: int) -> None:
        """Start recording this master's life (fresh segments after the previous ones)."""
        for journal in (self.replicas, self.tasks, self.evaluation):
            journal.open()
        self.replicas.record(encode(MasterStarted(port, self.digest, os.getpid())))

    def close(self) -> None:
        for journal in (self.replicas, self.tasks, self.evaluation):
            journal.close()
