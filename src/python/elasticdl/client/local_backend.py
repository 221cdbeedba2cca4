"""Jobs as process trees on this machine (the default platform).

Layout of a job directory (default ``~/.elasticdl/jobs/<job_name>``)::

    job.json        written by the client at submit: name, platform, master command, pid, times
    job_spec.json   the resolved job spec the master runs (``JobSpec.to_json``)
    status.json     written by the master while it runs (see ``job_status.JobStatus``)
    exit_code       the master's exit status, written by the wrapper shell when it ends
    cancelled       present once ``cancel`` was requested (time stamp inside)
    logs/master.log master stdout+stderr; logs/ps-0.log, logs/worker-0.log ... by the platform
    recovery-checkpoints/  the master's checkpoints for relaunched PS (when it has none given)
    journal/        the master's journal, from which a restarted master resumes the job
    job_secret      the job's secret (0600), written by the master
    .elasticdl-job  the marker: this directory holds a job the client submitted

Re-submitting a job of the same name replaces the previous job's files, and only those: the
entries above, in a directory that carries the marker. A directory without it (say a
``--job_dir`` that merely contains a ``job.json``) is never deleted; the client refuses it.

The master runs detached (own session and process group) under a tiny ``/bin/sh`` supervisor,
the job's *owner*: it records the master's exit status, so ``status`` is right even when the
client that submitted the job is long gone, and starts the master again when it was killed
by a signal (exit status >= 128: ``kill -9``, out of memory), at most
``$ELASTICDL_MASTER_RESTARTS`` times (default 10), unless the job was cancelled. The new master
resumes the job from its journal and adopts the PS and workers, which outlive a master but
not the owner (``elasticdl.common.parent_watch``). A job with a custom ``--job_dir`` is also reachable by name through a
symlink ``~/.elasticdl/jobs/<job_name>`` -> ``job_dir``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

from elasticdl.client.backend import JobBackend, JobHandle
from elasticdl.client.errors import ClientError, JobConflictError, JobNotFoundError, WaitTimeout
from elasticdl.client.master_runtime import MasterRuntime, resolve_master_runtime
from elasticdl.common.job_dir import (
    CANCELLED_FILE,
    EXIT_CODE_FILE,
    JOB_FILE,
    JOB_SPEC_FILE,
    JOURNAL_DIR,
    LOG_DIR,
    MARKER_FILE,
    MASTER_LOG,
    RECOVERY_DIR,
    SECRET_FILE,
    STATUS_FILE,
    jobs_root,
    temp_files_of,
    write_atomically,
)
from elasticdl.common.job_spec import JobSpec, master_argv
from elasticdl.common.job_status import JobStatus
from elasticdl.common.parent_watch import proc_start_time
from elasticdl.common.spec_codec import SpecError
from elasticdl.common.types import JobPhase, PlatformName

logger = logging.getLogger(__name__)

# What the client, the master and the local platform write into a job directory.
_OWN_FILES = (JOB_FILE, JOB_SPEC_FILE, STATUS_FILE, EXIT_CODE_FILE, CANCELLED_FILE, SECRET_FILE)
_OWN_DIRS = (LOG_DIR, RECOVERY_DIR, JOURNAL_DIR)

_JOB_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")

# The job's owner: runs the master ("$@" after the restart limit $1) and records its exit
# status in the file named by $0 (in the job directory, beside the "cancelled" file). The
# master and its replicas learn the owner's pid from $ELASTICDL_JOB_OWNER.
_WRAPPER = (
    "export ELASTICDL_JOB_OWNER=$$; max=$1; shift; n=0; "
    'while :; do "$@"; code=$?; '
    '[ "$code" -lt 128 ] || [ -e "${0%/*}/cancelled" ] || [ "$n" -ge "$max" ] && break; '
    "n=$((n + 1)); "
    'echo "elasticdl: the master ended with exit status $code; starting it again ($n/$max)"; '
    'done; echo "$code" > "$0"; exit "$code"'
)
MASTER_RESTARTS_ENV = "ELASTICDL_MASTER_RESTARTS"
DEFAULT_MASTER_RESTARTS = 10


def master_restarts(environ=None) -> int:
    """How often the owner starts a killed master again (``$ELASTICDL_MASTER_RESTARTS``)."""
    value = (os.environ if environ is None else environ).get(MASTER_RESTARTS_ENV, "").strip()
    if not value:
        return DEFAULT_MASTER_RESTARTS
    if not value.isdigit():
        raise ClientError(
            f"${MASTER_RESTARTS_ENV}={value!r}: set it to a whole number >= 0 "
            f"(0: a killed master is not started again)"
        )
    return int(value)


_POLL_SECONDS = 0.2


def _write_text_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    write_atomically(path, text, mode=mode)


def _write_json_atomic(path: Path, data: dict) -> None:
    _write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True))


def _read_json(path: Path) -> dict | None:
    # status.json is replaced atomically by the master, but tolerate a writer that does not.
    for _ in range(3):
        try:
            data = json.loads(path.read_text())
            return data if isinstance(data, dict) else None
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except (json.JSONDecodeError, UnicodeDecodeError):
            time.sleep(0.05)
    return None


def is_job_directory(directory: Path) -> bool:
    """Whether ``directory`` carries the marker the client writes into the job directories
    it creates."""
    return (directory / MARKER_FILE).is_file() and not (directory / MARKER_FILE).is_symlink()


def _clear_job_directory(directory: Path, what: str, legacy_name: str = "") -> bool:
    """Remove the previous job's files from ``directory`` (only what ElasticDL writes there),
    then the directory itself if ElasticDL created it and nothing else is left. Returns
    whether it is gone. Raises ClientError for a directory ElasticDL did not create.

    ``legacy_name``: the directory is the default one of that job under the jobs root; one
    written before the marker existed (its job.json names that job) counts as created."""
    if not directory.exists() and not directory.is_symlink():
        return True
    if not directory.is_dir() or directory.is_symlink():
        raise ClientError(f"{what} {directory} is not a directory; remove it or choose another")
    if not any(directory.iterdir()):
        return False  # empty: use it as it is
    if legacy_name and not is_job_directory(directory):
        old = _read_json(directory / JOB_FILE) or {}
        if old.get("job_name") == legacy_name and old.get("platform") == PlatformName.LOCAL:
            (directory / MARKER_FILE).write_text(json.dumps({"created_dir": True}) + "\n")
    if not is_job_directory(directory):
        raise ClientError(
            f"{what} {directory} exists and was not created by ElasticDL; "
            "use a new or empty directory, or remove it yourself"
        )
    for name in _OWN_FILES:
        for path in (directory / name, *temp_files_of(directory, name)):
            if path.is_file() or path.is_symlink():
                path.unlink()
    for name in _OWN_DIRS:
        path = directory / name
        if path.is_symlink():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
    marker = _read_json(directory / MARKER_FILE) or {}
    (directory / MARKER_FILE).unlink()
    if not marker.get("created_dir"):
        return False  # the user's directory: it stays
    try:
        directory.rmdir()
    except OSError:
        return False  # the user's own files stay, and so does the directory
    return True


def _proc_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int | None, start_time: str | None = None) -> bool:
    """True if ``pid`` is a live (non-zombie) process, and the same one when ``start_time``
    was recorded."""
    if not pid:
        return False
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our child that has ended
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if _proc_state(pid) == "Z":
        return False
    if start_time is not None:
        current = proc_start_time(pid)
        if current is not None and current != start_time:
            return False
    return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _last_line(path: Path, limit: int = 200) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = [
                line.strip()
                for line in f.read().decode("utf-8", "replace").splitlines()
                if line.strip()
            ]
    except OSError:
        return ""
    return lines[-1][:limit] if lines else ""


class LocalBackend(JobBackend):
    platform = PlatformName.LOCAL

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        runtime: MasterRuntime | None = None,
        cancel_grace_seconds: float = 15.0,
        exit_grace_seconds: float = 30.0,
    ) -> None:
        self.root = Path(root) if root else Path(jobs_root())
        self._runtime = runtime
        self.cancel_grace_seconds = cancel_grace_seconds
        self.exit_grace_seconds = exit_grace_seconds
        self._final_seen: dict[str, float] = {}
        self._children: dict[str, subprocess.Popen] = {}

    # ---- paths ---------------------------------------------------------------------------
    def job_dir(self, name: str) -> Path:
        """The directory of job ``name`` (following the symlink of a custom ``--job_dir``)."""
        return (self.root / name).resolve()

    def _require_job(self, name: str) -> tuple[Path, dict]:
        if not _JOB_NAME.fullmatch(name):
            # A name is a directory under the jobs root: '../x' must not reach outside it.
            raise JobNotFoundError(
                f"{name!r} is not a valid job name (lowercase letters, digits and '-'); "
                "see 'elasticdl list'"
            )
        directory = self.job_dir(name)
        job = _read_json(directory / JOB_FILE)
        if job is None:
            raise JobNotFoundError(
                f"no local job named {name!r} (looked in {self.root}); see 'elasticdl list'"
            )
        return directory, job

    # ---- submit --------------------------------------------------------------------------
    def submit(self, spec: JobSpec, yaml_path: str = "") -> JobHandle:
        if yaml_path:
            raise SpecError("--yaml writes a Kubernetes manifest; local jobs have none")
        name = spec.job_name
        directory = Path(spec.job_dir or self.root / name).expanduser().absolute()
        link = self.root / name
        runtime = self._runtime or resolve_master_runtime()  # fail before touching any file
        restarts = master_restarts()

        for existing in {directory, link.resolve()}:
            old = _read_json(existing / JOB_FILE)
            if old is not None and self._master_alive(existing, old):
                raise JobConflictError(
                    f"job {name!r} is still running (pid {old.get('pid')}); cancel it with "
                    f"'elasticdl cancel {name}' or choose another --job_name"
                )
        # Replace the previous job of that name: its files (only those) and a stale name link.
        if link.is_symlink() and link.absolute() == directory:
            link.unlink()  # a custom --job_dir before; now the default place
        default = directory == link.absolute()
        _clear_job_directory(directory, "--job_dir", legacy_name=name if default else "")
        if link.is_symlink():
            link.unlink()
        elif link.exists() and link.absolute() != directory:
            if not _clear_job_directory(link, "job directory", legacy_name=name):
                raise ClientError(
                    f"{link} still holds files ElasticDL did not write; move them away or "
                    "choose another --job_name"
                )
        created = not directory.exists()
        try:
            (directory / LOG_DIR).mkdir(parents=True, exist_ok=True)
            (directory / MARKER_FILE).write_text(
                json.dumps({"job_name": name, "created_dir": created}) + "\n"
            )
            if link.absolute() != directory:
                self.root.mkdir(parents=True, exist_ok=True)
                link.symlink_to(directory, target_is_directory=True)
            return self._start(spec, runtime, directory, restarts)
        except BaseException:
            # Nothing half-written: a job that did not start leaves no directory behind.
            if link.is_symlink() and link.resolve() == directory:
                link.unlink()
            _clear_job_directory(directory, "--job_dir")
            raise

    def _start(
        self, spec: JobSpec, runtime: MasterRuntime, directory: Path, restarts: int
    ) -> JobHandle:
        name = spec.job_name
        spec = spec.replace(platform=PlatformName.LOCAL, job_dir=str(directory))
        spec_path = directory / JOB_SPEC_FILE
        # 0600: the spec may hold the user's --envs (credentials for data sources, say).
        _write_text_atomic(spec_path, spec.to_json(only_changed=False, indent=2) + "\n", 0o600)
        command = runtime.command(master_argv(spec_file=str(spec_path)))
        created_at = time.time()
        job = {
            "job_name": name,
            "platform": PlatformName.LOCAL.value,
            "job_dir": str(directory),
            "command": command,
            "runtime": runtime.description,
            "created_at": created_at,
            "pid": None,
        }
        _write_json_atomic(directory / JOB_FILE, job)

        env = dict(os.environ)
        env.update(runtime.env)
        env["PYTHONUNBUFFERED"] = "1"  # the log shows progress as it happens
        with open(directory / LOG_DIR / MASTER_LOG, "ab") as log:
            proc = subprocess.Popen(
                [
                    "/bin/sh",
                    "-c",
                    _WRAPPER,
                    str(directory / EXIT_CODE_FILE),
                    str(restarts),
                    *command,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=os.getcwd(),
                env=env,
                start_new_session=True,  # survives the terminal; cancel kills the whole group
            )
        self._children[name] = proc
        job["pid"] = proc.pid
        job["pid_start_time"] = proc_start_time(proc.pid)
        _write_json_atomic(directory / JOB_FILE, job)
        logger.info("Started master of job %s (pid %d): %s", name, proc.pid, " ".join(command))
        return JobHandle(
            job_name=name,
            platform=PlatformName.LOCAL,
            created_at=created_at,
            job_dir=str(directory),
            pid=proc.pid,
        )

    # ---- status --------------------------------------------------------------------------
    def _master_alive(self, directory: Path, job: dict) -> bool:
        """Whether any process of the master's group (wrapper shell, master) still runs."""
        pid = job.get("pid")
        if not pid:
            return False
        proc = self._children.get(job.get("job_name", ""))
        if proc is not None and proc.pid == pid:
            if proc.poll() is None:  # poll() also reaps it, so a zombie never counts
                return True
        elif pid_alive(pid, job.get("pid_start_time")):
            return True
        elif pid_alive(pid):
            return False  # the pid now belongs to another process: the job is long gone
        # The wrapper shell may be gone (e.g. killed by SIGTERM) while the master still
        # shuts down in the same process group.
        return _group_alive(pid)

    def _status_of(self, directory: Path, job: dict) -> JobStatus:
        data = _read_json(directory / STATUS_FILE) or {}
        status = JobStatus.from_dict(
            data,
            job_name=job.get("job_name"),
            platform=PlatformName.LOCAL,
            job_dir=str(directory),
            created_at=job.get("created_at"),
        )
        cancelled = (directory / CANCELLED_FILE).exists()
        if status.is_final:
            if cancelled and status.phase != JobPhase.SUCCEEDED:
                status.phase, status.message = JobPhase.CANCELLED, "cancelled by user"
            return status
        if self._master_alive(directory, job):
            if cancelled:
                status.message = "cancelling"
            return status
        # The master is gone without reporting a final phase.
        if cancelled:
            status.phase, status.message = JobPhase.CANCELLED, "cancelled by user"
            return status
        exit_code = self._exit_code(directory)
        if exit_code == 0:
            status.phase = JobPhase.SUCCEEDED
            status.message = status.message or "master exited with code 0"
            return status
        status.phase = JobPhase.FAILED
        code = "" if exit_code is None else f" with code {exit_code}"
        last = _last_line(directory / LOG_DIR / MASTER_LOG)
        status.message = f"master exited unexpectedly{code}" + (
            f"; last log line: {last}" if last else ""
        )
        return status

    @staticmethod
    def _exit_code(directory: Path) -> int | None:
        try:
            return int((directory / EXIT_CODE_FILE).read_text().strip())
        except (OSError, ValueError):
            return None

    def status(self, name: str) -> JobStatus:
        directory, job = self._require_job(name)
        return self._status_of(directory, job)

    def list_jobs(self) -> list[JobStatus]:
        if not self.root.is_dir():
            return []
        result = []
        for entry in self.root.iterdir():
            directory = entry.resolve()
            job = _read_json(directory / JOB_FILE)
            if job is None or job.get("job_name") != entry.name:
                continue
            result.append(self._status_of(directory, job))
        result.sort(key=lambda s: (s.created_at or 0, s.job_name))
        return result

    def _finished(self, directory: Path, job: dict) -> bool:
        """Final phase reported *and* the master process gone (its last log lines written)."""
        if not self._status_of(directory, job).is_final:
            return False
        if not self._master_alive(directory, job):
            return True
        # A master that reported a final phase but does not exit is not waited for forever.
        first = self._final_seen.setdefault(str(directory), time.monotonic())
        return time.monotonic() - first > self.exit_grace_seconds

    def wait(
        self, name: str, timeout: float | None = None, poll_interval: float = 1.0
    ) -> JobStatus:
        """Like :meth:`JobBackend.wait`, and also until the master process has exited (at most
        ``exit_grace_seconds`` after it reported the final phase)."""
        directory, job = self._require_job(name)
        deadline = None if timeout is None else time.monotonic() + timeout
        poll = min(poll_interval, _POLL_SECONDS)
        while not self._finished(directory, job):
            if deadline is not None and time.monotonic() >= deadline:
                phase = self._status_of(directory, job).phase
                raise WaitTimeout(f"job {name} is still {phase} after {timeout:g}s")
            time.sleep(poll)
        return self._status_of(directory, job)

    # ---- logs ----------------------------------------------------------------------------
    def log_path(self, name: str, replica: str = "master") -> Path:
        directory, _ = self._require_job(name)
        stem = replica.removeprefix(f"elasticdl-{name}-")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", stem):
            # A replica names a file under the job's logs/: '../x' must not reach outside it.
            available = ", ".join(self.available_logs(name)) or "none yet"
            raise JobNotFoundError(
                f"--replica {replica!r} is not a replica name; available: {available}"
            )
        return directory / LOG_DIR / f"{stem}.log"

    def available_logs(self, name: str) -> list[str]:
        directory, _ = self._require_job(name)
        return sorted(p.stem for p in (directory / LOG_DIR).glob("*.log"))

    def logs(self, name: str, replica: str = "master", follow: bool = False) -> Iterator[str]:
        path = self.log_path(name, replica)  # raises for an unknown job before iteration
        return self._read_log(name, replica, path, follow)

    def _read_log(self, name: str, replica: str, path: Path, follow: bool) -> Iterator[str]:
        directory, job = self._require_job(name)
        while not path.exists():
            if not follow or self._status_of(directory, job).is_final:
                available = ", ".join(self.available_logs(name)) or "none yet"
                raise JobNotFoundError(
                    f"job {name!r} has no log for replica {replica!r}; available: {available}"
                )
            time.sleep(_POLL_SECONDS)
        with open(path, "rb") as f:
            while True:
                chunk = f.read(65536)
                if chunk:
                    yield chunk.decode("utf-8", "replace")
                    continue
                if not follow:
                    return
                if self._finished(directory, job):
                    rest = f.read()  # whatever was written between the last read and the end
                    if rest:
                        yield rest.decode("utf-8", "replace")
                    return
                time.sleep(_POLL_SECONDS)

    # ---- cancel --------------------------------------------------------------------------
    def cancel(self, name: str) -> JobStatus:
        directory, job = self._require_job(name)
        status = self._status_of(directory, job)
        if status.is_final:
            return status
        (directory / CANCELLED_FILE).write_text(f"{time.time()}\n")
        pid = job.get("pid")
        if pid and self._master_alive(directory, job):
            # SIGTERM lets the master stop its PS and workers (own process groups) cleanly.
            # The group holds the wrapper shell (which dies at once) and the master: wait for
            # the whole group, not just the group leader.
            self._signal_group(pid, signal.SIGTERM)
            deadline = time.monotonic() + self.cancel_grace_seconds
            while self._master_alive(directory, job) and time.monotonic() < deadline:
                time.sleep(0.1)
            if self._master_alive(directory, job):
                logger.warning(
                    "Master of job %s did not stop in %gs; killing it",
                    name,
                    self.cancel_grace_seconds,
                )
                self._signal_group(pid, signal.SIGKILL)
            # Reap our own child (a zombie keeps the group "alive") and let SIGKILL land.
            deadline = time.monotonic() + 5.0
            while self._master_alive(directory, job) and time.monotonic() < deadline:
                time.sleep(0.05)
        self._kill_leftover_replicas(name, directory)
        proc = self._children.pop(name, None)
        if proc is not None:
            proc.wait()
        return self._status_of(directory, job)

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass

    def _kill_leftover_replicas(self, name: str, directory: Path) -> None:
        """Replicas run in their own process groups; if the master died without stopping them
        (e.g. it was SIGKILLed), stop the ones it reported, after checking the pid still
        belongs to this job (Linux: the command line names the job directory or job name)."""
        data = _read_json(directory / STATUS_FILE) or {}
        for replica in data.get("replicas") or []:
            pid = replica.get("pid") if isinstance(replica, dict) else None
            if not isinstance(pid, int) or not pid_alive(pid):
                continue
            try:
                cmdline = (
                    Path(f"/proc/{pid}/cmdline")
                    .read_bytes()
                    .replace(b"\0", b" ")
                    .decode("utf-8", "replace")
                )
            except OSError:
                continue
            if (
                str(directory) in cmdline
                or f"--job_name={name}" in cmdline
                or f"--job_name {name}" in cmdline
            ):
                logger.warning(
                    "Killing leftover replica %s (pid %d) of job %s",
                    replica.get("name", "?"),
                    pid,
                    name,
                )
                self._signal_group(pid, signal.SIGKILL)


__all__ = ["LocalBackend", "pid_alive"]
