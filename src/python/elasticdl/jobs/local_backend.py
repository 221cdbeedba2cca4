"""Jobs as process trees on this machine (the default platform).

A job is its directory (:mod:`elasticdl.jobs.local_job_dir`) and its master, which runs
detached under the job's owner (:mod:`elasticdl.jobs.local_processes`). A job with a custom
``--job_dir`` is also reachable by name through a symlink ``~/.elasticdl/jobs/<job_name>`` ->
``job_dir``.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

from elasticdl.common.job_spec import JobSpec, jobs_root, master_argv
from elasticdl.common.job_status import JobStatus
from elasticdl.common.parent_watch import proc_start_time
from elasticdl.common.spec_codec import SpecError
from elasticdl.common.types import JobPhase, PlatformName
from elasticdl.jobs.backend import JobBackend, JobHandle, Progress, refuse_package_path
from elasticdl.jobs.errors import ClientError, JobConflictError, JobNotFoundError, WaitTimeout
from elasticdl.jobs.local_job_dir import (
    CANCELLED_FILE,
    EXIT_CODE_FILE,
    JOB_FILE,
    JOB_SPEC_FILE,
    LOG_DIR,
    MASTER_LOG,
    STATUS_FILE,
    clear_job_directory,
    last_line,
    mark_job_directory,
    read_json,
    write_json_atomic,
    write_text_atomic,
)
from elasticdl.jobs.local_processes import (
    OWNER_SCRIPT,
    group_alive,
    kill_leftover_replicas,
    master_restarts,
    pid_alive,
    signal_group,
)
from elasticdl.jobs.master_runtime import MasterRuntime, resolve_master_runtime

logger = logging.getLogger(__name__)

_JOB_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_POLL_SECONDS = 0.2


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
        job = read_json(directory / JOB_FILE)
        if job is None:
            raise JobNotFoundError(
                f"no local job named {name!r} (looked in {self.root}); see 'elasticdl list'"
            )
        return directory, job

    # ---- submit --------------------------------------------------------------------------
    def submit(
        self,
        spec: JobSpec,
        yaml_path: str = "",
        package_path: str = "",
        progress: Progress | None = None,
    ) -> JobHandle:
        refuse_package_path(package_path)
        if yaml_path:
            raise SpecError("--yaml writes a Kubernetes manifest; local jobs have none")
        name = spec.job_name
        directory = Path(spec.job_dir or self.root / name).expanduser().absolute()
        link = self.root / name
        runtime = self._runtime or resolve_master_runtime()  # fail before touching any file
        restarts = master_restarts()

        for existing in {directory, link.resolve()}:
            old = read_json(existing / JOB_FILE)
            if old is not None and self._master_alive(existing, old):
                raise JobConflictError(
                    f"job {name!r} is still running (pid {old.get('pid')}); cancel it with "
                    f"'elasticdl cancel {name}' or choose another --job_name"
                )
        # Replace the previous job of that name: its files (only those) and a stale name link.
        if link.is_symlink() and link.absolute() == directory:
            link.unlink()  # a custom --job_dir before; now the default place
        default = directory == link.absolute()
        clear_job_directory(directory, "--job_dir", legacy_name=name if default else "")
        if link.is_symlink():
            link.unlink()
        elif link.exists() and link.absolute() != directory:
            if not clear_job_directory(link, "job directory", legacy_name=name):
                raise ClientError(
                    f"{link} still holds files ElasticDL did not write; move them away or "
                    "choose another --job_name"
                )
        created = not directory.exists()
        try:
            (directory / LOG_DIR).mkdir(parents=True, exist_ok=True)
            mark_job_directory(directory, name, created)
            if link.absolute() != directory:
                self.root.mkdir(parents=True, exist_ok=True)
                link.symlink_to(directory, target_is_directory=True)
            return self._start(spec, runtime, directory, restarts)
        except BaseException:
            # Nothing half-written: a job that did not start leaves no directory behind.
            if link.is_symlink() and link.resolve() == directory:
                link.unlink()
            clear_job_directory(directory, "--job_dir")
            raise

    def _start(
        self, spec: JobSpec, runtime: MasterRuntime, directory: Path, restarts: int
    ) -> JobHandle:
        name = spec.job_name
        spec = spec.replace(platform=PlatformName.LOCAL, job_dir=str(directory))
        spec_path = directory / JOB_SPEC_FILE
        # 0600: the spec may hold the user's --envs (credentials for data sources, say).
        write_text_atomic(spec_path, spec.to_json(only_changed=False, indent=2) + "\n", 0o600)
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
        write_json_atomic(directory / JOB_FILE, job)

        env = dict(os.environ)
        env.update(runtime.env)
        env["PYTHONUNBUFFERED"] = "1"  # the log shows progress as it happens
        with open(directory / LOG_DIR / MASTER_LOG, "ab") as log:
            proc = subprocess.Popen(
                [
                    "/bin/sh",
                    "-c",
                    OWNER_SCRIPT,
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
        write_json_atomic(directory / JOB_FILE, job)
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
        """Whether any process of the master's group (the owner's shell, master) still runs."""
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
        # The owner's shell may be gone (e.g. killed by SIGTERM) while the master still
        # shuts down in the same process group.
        return group_alive(pid)

    def _status_of(self, directory: Path, job: dict) -> JobStatus:
        data = read_json(directory / STATUS_FILE) or {}
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
        last = last_line(directory / LOG_DIR / MASTER_LOG)
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
            job = read_json(directory / JOB_FILE)
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

    # ---- changing the PS count ------------------------------------------------------------
    def scale_ps(self, name: str, num_ps: int, timeout: float | None = None) -> str:
        from elasticdl.jobs import master_calls

        directory, _ = self._require_job(name)
        return master_calls.scale_ps(directory, name, num_ps, timeout=timeout)

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
            # The group holds the owner's shell (which dies at once) and the master: wait for
            # the whole group, not just the group leader.
            signal_group(pid, signal.SIGTERM)
            deadline = time.monotonic() + self.cancel_grace_seconds
            while self._master_alive(directory, job) and time.monotonic() < deadline:
                time.sleep(0.1)
            if self._master_alive(directory, job):
                logger.warning(
                    "Master of job %s did not stop in %gs; killing it",
                    name,
                    self.cancel_grace_seconds,
                )
                signal_group(pid, signal.SIGKILL)
            # Reap our own child (a zombie keeps the group "alive") and let SIGKILL land.
            deadline = time.monotonic() + 5.0
            while self._master_alive(directory, job) and time.monotonic() < deadline:
                time.sleep(0.05)
        replicas = (read_json(directory / STATUS_FILE) or {}).get("replicas") or []
        kill_leftover_replicas(name, directory, replicas)
        proc = self._children.pop(name, None)
        if proc is not None:
            proc.wait()
        return self._status_of(directory, job)
