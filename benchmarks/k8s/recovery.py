"""Timing a job's recovery from killed workers on a Kubernetes cluster, from outside the job:
the master's journal (its ``--job_dir`` on a volume the host sees) and the API server.

Shared by ``recovery_latency.py`` (the benchmark) and the real-node test that runs it at a
tiny size (``tests/python/elasticdl_tests/k8s_node/recovery_latency_test.py``).
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

JOURNAL_POLL_S = 0.02
POD_POLL_S = 0.1
# The journal's frame header (master/journal.py): payload length, CRC32 of the payload.
_FRAME = struct.Struct("<II")


@dataclass
class JournalTail:
    """The master's journal as it grows: which worker holds which task, re-queues, the workers
    launched in place of ended ones, and finished tasks, each with the time it was read."""

    directory: Path
    held: dict[int, int] = field(default_factory=dict)  # task id -> worker id
    requeued: list[tuple[float, list[int]]] = field(default_factory=list)
    replaced_by: dict[int, tuple[float, int]] = field(default_factory=dict)  # worker -> new
    finished: dict[int, float] = field(default_factory=dict)  # worker -> its first finished task
    training_done_at: float | None = None  # the master recorded the last training task done
    _offsets: dict[str, int] = field(default_factory=dict)

    def poll(self) -> None:
        now = time.monotonic()
        for path in sorted(self.directory.glob("*.log")):
            for op in self._new_records(path):
                self._apply(op, now)

    def _new_records(self, path: Path) -> list[dict]:
        try:
            data = path.read_bytes()[self._offsets.get(path.name, 0) :]
        except OSError:  # compacted away meanwhile
            return []
        records, pos = [], 0
        while pos + _FRAME.size <= len(data):
            length, crc = _FRAME.unpack_from(data, pos)
            payload = data[pos + _FRAME.size : pos + _FRAME.size + length]
            if len(payload) < length or zlib.crc32(payload) != crc:
                break  # being written: read it next time
            records.append(json.loads(payload))
            pos += _FRAME.size + length
        self._offsets[path.name] = self._offsets.get(path.name, 0) + pos
        return records

    def _apply(self, op: dict, now: float) -> None:
        kind, worker = op.get("o"), op.get("w")
        if kind == "r":  # a report, maybe with the next task handed out ("g")
            self.held.pop(op["t"], None)
            if op.get("s"):
                self.finished.setdefault(worker, now)
            if op.get("g"):
                self.held[op["g"]] = worker
        elif kind == "g":
            if op.get("a"):
                self.held.pop(op["a"][0], None)
            self.held[op["t"]] = worker
        elif kind == "l":  # a lease: every task of it held until reported or re-queued
            for task_id in op["t"]:
                self.held[task_id] = worker
        elif kind == "q":
            for task_id in op["t"]:
                self.held.pop(task_id, None)
            self.requeued.append((now, op["t"]))
        elif kind == "td":
            self.training_done_at = now
        elif kind == "end" and op.get("k") == "worker" and op.get("by") is not None:
            self.replaced_by.setdefault(op["i"], (now, op["by"]))

    def busy_workers(self) -> set[int]:
        return set(self.held.values())


class RecoveryTimeout(RuntimeError):
    """A recovery step did not happen in time (the message says which)."""


class JobEndedEarly(RecoveryTimeout):
    """The job finished training before a step could be measured: the job is too short for the
    kills asked of it on this machine (the message says which step)."""


def _unless_training_done(journal: JournalTail, predicate, what: str):
    """``predicate``, failing at once once the journal shows training done: the step it waits
    for can no longer come."""

    def check():
        value = predicate()
        if (value is None or value is False) and journal.training_done_at is not None:
            raise JobEndedEarly(f"the job finished training while waiting for {what}")
        return value

    return check


@dataclass
class Kill:
    """One kill: the worker, the one launched in its place, the tasks the master re-queued and
    the seconds from the kill to each step."""

    victim: int
    replacement: int
    requeued_tasks: list[int]
    requeued_s: float
    running_s: float
    trained_s: float


def until(predicate, timeout: float, what: str, poll: float = JOURNAL_POLL_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value is not None and value is not False:
            return value
        time.sleep(poll)
    raise RecoveryTimeout(f"timed out after {timeout:g} s waiting for {what}")


def worker_pod(core, namespace: str, job: str, worker: int):
    from elasticdl.k8s import names
    from kubernetes.client.rest import ApiException

    try:
        return core.read_namespaced_pod(names.pod_name(job, "worker", worker), namespace)
    except ApiException as e:
        if e.status == 404:  # not created yet
            return None
        raise


@dataclass
class Recovery:
    """How one lost worker came back, as monotonic times: its tasks re-queued, the worker
    launched in its place Running, that worker's first finished task."""

    replacement: int
    tasks: list[int]
    requeued_at: float
    running_at: float
    trained_at: float


def follow_recovery(
    core,
    namespace: str,
    job: str,
    journal: JournalTail,
    worker: int,
    since: float,
    requeue_timeout: float,
) -> Recovery:
    """Follow worker ``worker``'s recovery from the moment ``since`` (it was killed or its node
    stopped): the journal's first re-queue after ``since`` (within ``requeue_timeout`` s), the
    worker launched in its place, its pod Running (CoreV1Api ``core``), its first finished
    task. Raises ``RecoveryTimeout`` naming the step that did not come."""

    def requeued():
        journal.poll()
        return next(((t, ids) for t, ids in journal.requeued if t > since), None)

    t_requeued, tasks = until(requeued, requeue_timeout, f"worker {worker}'s tasks re-queued")
    _, new = until(lambda: journal.poll() or journal.replaced_by.get(worker), 120, "a replacement")

    def running():
        pod = worker_pod(core, namespace, job, new)
        return pod is not None and pod.status.phase == "Running" and time.monotonic()

    t_running = until(running, 300, f"worker {new} Running", POD_POLL_S)
    training = f"worker {new} training"
    t_trained = until(
        _unless_training_done(
            journal, lambda: journal.poll() or journal.finished.get(new), training
        ),
        600,
        training,
    )
    return Recovery(new, tasks, t_requeued, t_running, t_trained)


def measure_kills(
    core,
    namespace: str,
    job: str,
    journal: JournalTail,
    kills: int,
    how: str,
    docker: Callable[..., object],
) -> list[Kill]:
    """``kills`` times: wait until every worker holding a task has trained one (so a
    replacement is not killed before it counts), kill the lowest-numbered of them -- ``how``:
    ``docker`` kills its container through ``docker(*args)`` (the node engine's CLI),
    ``delete`` deletes its pod -- and time its recovery: the journal's re-queue, the
    replacement's pod Running (CoreV1Api ``core``), the replacement's first finished task."""
    rows: list[Kill] = []
    for n in range(kills):

        def victim():
            journal.poll()
            busy = journal.busy_workers()
            # Wait until the last replacement trained (every busy worker has finished a task).
            if not busy or any(w not in journal.finished for w in busy):
                return None
            pod = worker_pod(core, namespace, job, min(busy))
            return pod if pod is not None and pod.status.phase == "Running" else None

        holding = f"a worker holding a task (kill {n + 1} of {kills})"
        pod = until(_unless_training_done(journal, victim, holding), 600, holding)
        worker = int(pod.metadata.name.rsplit("-", 1)[1])
        t0 = time.monotonic()
        if how == "docker":
            docker("kill", pod.status.container_statuses[0].container_id.split("://", 1)[1])
        else:
            core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)

        step = follow_recovery(core, namespace, job, journal, worker, t0, requeue_timeout=120)
        kill = Kill(
            worker,
            step.replacement,
            step.tasks,
            step.requeued_at - t0,
            step.running_at - t0,
            step.trained_at - t0,
        )
        rows.append(kill)
        print(
            f"  kill {n + 1:2d}: worker {worker} -> {kill.replacement}: re-queued in "
            f"{kill.requeued_s * 1000:.0f} ms, replacement Running after {kill.running_s:.2f} "
            f"s, trained after {kill.trained_s:.2f} s",
            flush=True,
        )
    return rows
