"""The processes of a local job: the job's owner that runs the master, and how the client
tells whether a recorded process is still the job's.

The master runs detached (own session and process group) under a tiny ``/bin/sh`` script, the
job's *owner* (:data:`OWNER_SCRIPT`): it records the master's exit status, so ``status`` is
right even when the client that submitted the job is long gone, and starts the master again
when it was killed by a signal (exit status >= 128: ``kill -9``, out of memory), at most
``$ELASTICDL_MASTER_RESTARTS`` times (default 10), unless the job was cancelled. The new
master resumes the job from its journal and adopts the PS and workers, which outlive a master
but not the owner (``elasticdl.common.parent_watch``).
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from elasticdl.common.parent_watch import proc_start_time
from elasticdl.jobs.errors import ClientError

logger = logging.getLogger(__name__)

# Runs the master ("$@" after the restart limit $1) and records its exit status in the file
# named by $0 (in the job directory, beside the "cancelled" file). The master and its replicas
# learn the owner's pid from $ELASTICDL_JOB_OWNER.
OWNER_SCRIPT = (
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


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def kill_leftover_replicas(name: str, directory: Path, replicas: list) -> None:
    """Replicas run in their own process groups; if the master died without stopping them
    (e.g. it was SIGKILLed), stop the ones it reported (``replicas`` of its status.json),
    after checking the pid still belongs to this job (Linux: the command line names the job
    directory or job name)."""
    for replica in replicas:
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
            signal_group(pid, signal.SIGKILL)
