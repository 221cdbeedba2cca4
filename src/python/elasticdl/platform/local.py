"""Runs every replica of a job as a child process of the master (the default platform).

Each replica gets its own process group (so ``delete`` also stops anything it spawned) and
writes stdout+stderr to ``<job_dir>/logs/<type>-<id>.log`` (a relaunched replica appends to
its file after a separator line). Exit codes follow container conventions: a process killed
by signal N reports ``128 + N`` (SIGKILL -> 137), which the master reads as preemption.

Children are started with the master's own interpreter and ``PYTHONPATH`` set to the master's
``sys.path``, so they import exactly the same code also when the master runs from a PEX.

When the master runs under the job's owner (the client's supervisor, ``$ELASTICDL_JOB_OWNER``)
its replicas outlive it and end with the owner instead (``common.parent_watch``); a restarted
master adopts them: the replica with the recorded pid and start time whose environment
names this job's exit-status file is watched by polling (it is not this process's child) and
its end read from that file (``<job_dir>/logs/<type>-<id>.exit``; none: it was killed).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from elasticdl.common.job_dir import LOG_DIR, default_job_dir, replica_exit_name, replica_log_name
from elasticdl.common.job_spec import JobSpec
from elasticdl.common.parent_watch import (
    EXIT_STATUS_FILE_ENV,
    EXIT_WITH_OWNER_ENV,
    EXIT_WITH_PARENT_ENV,
    owner_value,
    proc_start_time,
    process_alive,
    read_exit_status,
)
from elasticdl.platform.base import (
    EXIT_CODE_KILLED,
    REASON_DELETED_BY_MASTER,
    REASON_ERROR,
    Platform,
    PlatformError,
    PlatformTraits,
    ReplicaEvent,
    ReplicaPhase,
    ReplicaSpec,
    ReplicaType,
)

logger = logging.getLogger(__name__)

_TAIL_LINES = 20  # log lines quoted in the event message of a failed replica
# Set by the client's supervisor to its own pid: replicas end with it, not with the master.
JOB_OWNER_ENV = "ELASTICDL_JOB_OWNER"
_ADOPTED_POLL_SECONDS = 0.2
_STOP = object()  # sentinel that ends the event dispatcher


def pick_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def child_pythonpath() -> str:
    """The master's import path as a PYTHONPATH value (works from a venv, a source tree or a
    PEX, whose sys.path points into its unpacked/zipped code)."""
    return os.pathsep.join(p for p in sys.path if p)


def read_tail(path: Path, lines: int = _TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def exit_code_of(returncode: int) -> int:
    """Popen's returncode (-N for signal N) -> container-style exit code (128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


class _AdoptedProcess:
    """The part of ``subprocess.Popen`` the platform uses, for a replica a previous master
    started: it is not our child, so its end is polled and its status read from its file."""

    def __init__(self, pid: int, start_time: str | None, status_file: Path) -> None:
        self.pid = pid
        self._start_time = start_time
        self._status_file = status_file
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not process_alive(self.pid, self._start_time):
            code = read_exit_status(self._status_file)
            self.returncode = -signal.SIGKILL if code is None else code
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(_ADOPTED_POLL_SECONDS)
        return self.returncode


@dataclasses.dataclass
class _Child:
    spec: ReplicaSpec
    proc: subprocess.Popen | _AdoptedProcess
    log_path: Path
    deleting: bool = False
    watcher: threading.Thread | None = None


class LocalProcessPlatform(Platform):
    def __init__(
        self,
        job_name: str,
        job_dir: str | os.PathLike,
        host: str = "127.0.0.1",
        python: str | None = None,
    ) -> None:
        super().__init__(job_name)
        self.job_dir = Path(job_dir)
        self.log_dir = self.job_dir / LOG_DIR
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.python = python or sys.executable
        self._lock = threading.RLock()
        self._children: dict[tuple[ReplicaType, int], _Child] = {}
        self._ports: dict[tuple[ReplicaType, int], int] = {}
        self._events: queue.Queue = queue.Queue()
        self._closed = False
        owner = os.environ.get(JOB_OWNER_ENV, "")
        # Only the process that really started this master owns the job.
        self._owner = int(owner) if owner.isdigit() and int(owner) == os.getppid() else None
        # One dispatcher thread delivers events in order, so listeners never run concurrently.
        self._dispatcher = threading.Thread(
            target=self._dispatch, name="local-platform-events", daemon=True
        )
        self._dispatcher.start()

    @classmethod
    def from_spec(cls, spec: JobSpec) -> "LocalProcessPlatform":
        return cls(job_name=spec.job_name, job_dir=spec.job_dir or default_job_dir(spec.job_name))

    @property
    def traits(self) -> PlatformTraits:
        return PlatformTraits(
            bind_host=self.host, shared_host=True, shared_job_dir=True, port_may_be_taken=True
        )

    # ---- addresses -----------------------------------------------------------------------
    def address(self, replica_type: ReplicaType, replica_id: int) -> str:
        key = (ReplicaType(replica_type), replica_id)
        with self._lock:
            if key not in self._ports:
                self._ports[key] = pick_free_port(self.host)
            return f"{self.host}:{self._ports[key]}"

    def master_address(self, port: int) -> str:
        return f"{self.host}:{port}"

    def log_path(self, replica_type: ReplicaType, replica_id: int) -> Path:
        return self.log_dir / replica_log_name(ReplicaType(replica_type).value, replica_id)

    def log_location(self, replica_type: ReplicaType, replica_id: int) -> str:
        return str(self.log_path(replica_type, replica_id))

    def exit_status_path(self, replica_type: ReplicaType, replica_id: int) -> Path:
        return self.log_dir / replica_exit_name(ReplicaType(replica_type).value, replica_id)

    @property
    def replicas_outlive_master(self) -> bool:
        return self._owner is not None

    def reserve_address(self, replica_type: ReplicaType, replica_id: int, address: str) -> None:
        host, _, port = address.rpartition(":")
        if host != self.host or not port.isdigit():
            raise PlatformError(f"address {address!r} is not on this platform's host {self.host}")
        with self._lock:
            self._ports[(ReplicaType(replica_type), replica_id)] = int(port)

    # ---- lifecycle -----------------------------------------------------------------------
    def launch(self, spec: ReplicaSpec) -> None:
        key = (spec.replica_type, spec.replica_id)
        with self._lock:
            if self._closed:
                raise PlatformError("platform is shut down; cannot launch more replicas")
            old = self._children.get(key)
            if old is not None and old.proc.poll() is None:
                raise PlatformError(f"{spec.replica_type}-{spec.replica_id} is still running")
            if spec.port is not None:
                self._ports.setdefault(key, spec.port)
            log_path = self.log_path(*key)
            env = dict(os.environ)
            env.update(spec.env)
            env.update(spec.secret_env)
            env["PYTHONPATH"] = child_pythonpath()
            env["PYTHONUNBUFFERED"] = "1"  # logs appear as they are written
            status_file = self.exit_status_path(*key)
            status_file.unlink(missing_ok=True)  # a previous life's
            env[EXIT_STATUS_FILE_ENV] = str(status_file)
            if self._owner is not None:  # replicas outlive the master, not the job's owner
                env[EXIT_WITH_OWNER_ENV] = owner_value(self._owner)
                env.pop(EXIT_WITH_PARENT_ENV, None)
            else:  # replicas end with their master
                env[EXIT_WITH_PARENT_ENV] = str(os.getpid())
                env.pop(EXIT_WITH_OWNER_ENV, None)
            cmd = spec.command(self.python)
            self._events.put(ReplicaEvent(spec.replica_type, spec.replica_id, ReplicaPhase.PENDING))
            with open(log_path, "ab") as log:
                log.write(
                    f"===== {time.strftime('%Y-%m-%d %H:%M:%S')} launching: {' '.join(cmd)}\n".encode()
                )
                log.flush()
                try:
                    proc = subprocess.Popen(
                        cmd,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,  # own process group, see delete()
                    )
                except OSError as e:
                    self._events.put(
                        ReplicaEvent(
                            spec.replica_type,
                            spec.replica_id,
                            ReplicaPhase.FAILED,
                            exit_code=None,
                            reason=REASON_ERROR,
                            message=f"cannot start: {e}",
                        )
                    )
                    raise PlatformError(f"cannot start {cmd[:3]}: {e}") from e
            self._watch_child(_Child(spec=spec, proc=proc, log_path=log_path))
            logger.info(
                "Launched %s-%d (pid %d), log: %s",
                spec.replica_type,
                spec.replica_id,
                proc.pid,
                log_path,
            )

    def _watch_child(self, child: _Child) -> None:
        spec = child.spec
        self._children[(spec.replica_type, spec.replica_id)] = child
        self._events.put(ReplicaEvent(spec.replica_type, spec.replica_id, ReplicaPhase.RUNNING))
        child.watcher = threading.Thread(
            target=self._watch,
            args=(child,),
            name=f"watch-{spec.replica_type}-{spec.replica_id}",
            daemon=True,
        )
        child.watcher.start()

    def replica_identity(self, replica_type: ReplicaType, replica_id: int) -> dict | None:
        pid = self.replica_pid(replica_type, replica_id)
        if pid is None:
            return None
        return {"pid": pid, "start": proc_start_time(pid)}

    def reclaim(self, replica_type: ReplicaType, replica_id: int) -> int:
        entry = f"{EXIT_STATUS_FILE_ENV}={self.exit_status_path(replica_type, replica_id)}"
        stopped = 0
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            pid = int(name)
            if process_alive(pid) and _environ_has(pid, entry, wait_s=0):
                logger.warning(
                    "Stopping %s-%d (pid %d): started by a previous master that did not record it",
                    replica_type,
                    replica_id,
                    pid,
                )
                try:
                    os.killpg(pid, signal.SIGKILL)  # its own session: pgid == pid
                except (ProcessLookupError, PermissionError):
                    pass
                stopped += 1
        return stopped

    def adopt(self, spec: ReplicaSpec, identity: dict | None) -> bool:
        """Watch the replica a previous master launched as ``spec`` (``identity`` from
        ``replica_identity``) if that very process still runs: same pid and start time, and
        its environment names this replica's exit-status file (so it is this job's, not a
        process that reused the pid). Returns False, having emitted how it ended, otherwise."""
        key = (spec.replica_type, spec.replica_id)
        status_file = self.exit_status_path(*key)
        pid = (identity or {}).get("pid")
        start = (identity or {}).get("start")
        ours = (
            isinstance(pid, int)
            and process_alive(pid, start)
            and _environ_has(pid, f"{EXIT_STATUS_FILE_ENV}={status_file}")
        )
        if spec.port is not None:
            with self._lock:
                self._ports.setdefault(key, spec.port)
        if not ours:
            code = read_exit_status(status_file)
            self._events.put(_ended_event(spec, code))
            return False
        proc = _AdoptedProcess(pid, start, status_file)
        with self._lock:
            if self._closed:
                raise PlatformError("platform is shut down; cannot adopt replicas")
            self._watch_child(_Child(spec=spec, proc=proc, log_path=self.log_path(*key)))
        logger.info("Adopted %s-%d (pid %d)", spec.replica_type, spec.replica_id, pid)
        return True

    def replica_pid(self, replica_type: ReplicaType, replica_id: int) -> int | None:
        """Process id of the live replica, or None (handy for tests and debugging)."""
        with self._lock:
            child = self._children.get((ReplicaType(replica_type), replica_id))
            if child is None or child.proc.poll() is not None:
                return None
            return child.proc.pid

    def _watch(self, child: _Child) -> None:
        returncode = child.proc.wait()
        code = exit_code_of(returncode)
        spec = child.spec
        if child.deleting:
            event = ReplicaEvent(
                spec.replica_type,
                spec.replica_id,
                ReplicaPhase.DELETED,
                code,
                REASON_DELETED_BY_MASTER,
            )
        elif code == 0:
            event = ReplicaEvent(spec.replica_type, spec.replica_id, ReplicaPhase.SUCCEEDED, 0)
        else:
            if returncode < 0:
                reason = signal.Signals(-returncode).name
            else:
                reason = REASON_ERROR
            event = ReplicaEvent(
                spec.replica_type,
                spec.replica_id,
                ReplicaPhase.FAILED,
                code,
                reason,
                read_tail(child.log_path),
            )
        logger.info(
            "%s-%d exited with code %d (%s)", spec.replica_type, spec.replica_id, code, event.phase
        )
        self._events.put(event)

    def delete(
        self, replica_type: ReplicaType, replica_id: int, grace_seconds: float = 10.0
    ) -> None:
        with self._lock:
            child = self._children.get((ReplicaType(replica_type), replica_id))
            if child is None or child.proc.poll() is not None:
                return
            child.deleting = True
        self._terminate([child], grace_seconds)

    def _terminate(self, children: list[_Child], grace_seconds: float) -> None:
        """SIGTERM each child's process group, then SIGKILL what is left after the grace."""
        for child in children:
            _signal_group(child.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        for child in children:
            try:
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(child.proc, signal.SIGKILL)
                child.proc.wait()
            # Also reap stragglers the replica spawned in its group.
            _signal_group(child.proc, signal.SIGKILL)
        for child in children:
            if child.watcher is not None:
                child.watcher.join(timeout=5)

    def shutdown(self, delete_all: bool = True, grace_seconds: float = 10.0) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            alive = [c for c in self._children.values() if c.proc.poll() is None]
            for c in alive:
                c.deleting = True
        if delete_all:
            self._terminate(alive, grace_seconds)
        self._events.put(_STOP)
        if threading.current_thread() is not self._dispatcher:
            self._dispatcher.join(timeout=10)

    # ---- events --------------------------------------------------------------------------
    def _dispatch(self) -> None:
        while True:
            event = self._events.get()
            if event is _STOP:
                return
            try:
                self._emit(event)
            except Exception:  # a buggy listener must not stop event delivery
                logger.exception("Replica event listener failed on %s", event)


def _environ_has(pid: int, entry: str, wait_s: float = 1.0) -> bool:
    """Whether process ``pid``'s environment holds ``entry``; a process that is just being
    started shows its new environment only once exec has set it up: wait that long."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if entry.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return True
        except OSError:
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _ended_event(spec: ReplicaSpec, code: int | None) -> ReplicaEvent:
    """How a replica that ended while no master watched it ended: its exit-status file, or
    killed (no file)."""
    if code == 0:
        return ReplicaEvent(spec.replica_type, spec.replica_id, ReplicaPhase.SUCCEEDED, 0)
    if code is None:
        return ReplicaEvent(
            spec.replica_type,
            spec.replica_id,
            ReplicaPhase.FAILED,
            EXIT_CODE_KILLED,
            "SIGKILL",
            "ended while the master was down, without recording its exit status",
        )
    return ReplicaEvent(spec.replica_type, spec.replica_id, ReplicaPhase.FAILED, code, REASON_ERROR)


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
