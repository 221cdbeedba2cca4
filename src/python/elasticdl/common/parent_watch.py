"""Replicas that are processes of their job end with it, and tell how they ended.

A local job's PS and workers are child processes of the master, each in its own session (so a
Ctrl-C in a terminal does not reach them and the master can stop each on its own). If the
job is gone they would linger: a PS serving a model nobody reads, a worker retrying a master
that never comes back. The local platform names what they must not outlive:

* ``$ELASTICDL_EXIT_WITH_OWNER`` = ``pid:start_time`` of the job's *owner*, the small
  supervisor the client starts the master under (it restarts a master that dies, see
  ``jobs/local_processes.py``). Replicas outlive a master crash, so the restarted master can
  adopt them, but stop once the owner is gone (the job was cancelled or ended).
* ``$ELASTICDL_EXIT_WITH_PARENT`` = the master's pid, for a master run without an owner
  (``python -m elasticdl.master.main`` by hand, tests): replicas stop once their parent is no
  longer that process.

A replica that ends on its own writes its exit status into ``$ELASTICDL_EXIT_STATUS_FILE``
(:func:`run_main`): a restarted master is not the parent of the replicas it adopted and cannot
wait for them, so that file is how it tells "finished" from "failed"; no file means the
process was killed (SIGKILL, out of memory). On Kubernetes the master pod owns its replicas'
pods and the cluster's garbage collector removes them.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

from elasticdl.common.job_dir import write_atomically

logger = logging.getLogger(__name__)

EXIT_WITH_PARENT_ENV = "ELASTICDL_EXIT_WITH_PARENT"
EXIT_WITH_OWNER_ENV = "ELASTICDL_EXIT_WITH_OWNER"
EXIT_STATUS_FILE_ENV = "ELASTICDL_EXIT_STATUS_FILE"
POLL_SECONDS = 0.5
# After SIGTERM (the replica's own graceful stop) the process is ended this long later.
GRACE_SECONDS = 10.0


def proc_start_time(pid: int) -> str | None:
    """Start time of a process in clock ticks since boot (Linux); tells a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[19] if len(fields) > 19 else None


def process_alive(pid: int, start_time: str | None = None) -> bool:
    """``pid`` is a live (non-zombie) process, and the one started at ``start_time`` if given."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    if stat[0] == "Z":
        return False
    return start_time is None or (len(stat) > 19 and stat[19] == start_time)


def owner_value(pid: int) -> str:
    """The ``$ELASTICDL_EXIT_WITH_OWNER`` value naming process ``pid``."""
    return f"{pid}:{proc_start_time(pid) or ''}"


def exit_with_parent(environ: dict[str, str] | None = None) -> threading.Thread | None:
    """Start the watch ``$ELASTICDL_EXIT_WITH_OWNER`` or ``$ELASTICDL_EXIT_WITH_PARENT`` asks for."""
    env = os.environ if environ is None else environ
    owner = env.get(EXIT_WITH_OWNER_ENV, "")
    if owner:
        pid, _, start = owner.partition(":")
        if pid.isdigit():
            return _start(_owner_alive(int(pid), start or None), f"the job's owner (pid {pid})")
    value = env.get(EXIT_WITH_PARENT_ENV, "")
    if not value.isdigit():
        return None
    parent = int(value)
    return _start(lambda: os.getppid() == parent, f"the master (pid {parent})")


def _owner_alive(pid: int, start: str | None) -> Callable[[], bool]:
    return lambda: process_alive(pid, start)


def _start(alive: Callable[[], bool], what: str) -> threading.Thread | None:
    if not alive():  # already gone before we looked
        _stop(what)
        return None
    thread = threading.Thread(target=_watch, args=(alive, what), name="parent-watch", daemon=True)
    thread.start()
    return thread


def _watch(alive: Callable[[], bool], what: str) -> None:
    while alive():
        time.sleep(POLL_SECONDS)
    _stop(what)


def _stop(what: str) -> None:
    logger.error("%s is gone: this replica stops", what)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_SECONDS)
    os._exit(1)


def run_main(main: Callable[[], int], environ: dict[str, str] | None = None) -> int:
    """``main()``'s exit status, also written to ``$ELASTICDL_EXIT_STATUS_FILE`` (if set) when
    it returns or raises."""
    code = 1
    try:
        code = main()
        return code
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        raise
    finally:
        record_exit_status(code, environ)


def record_exit_status(code: int, environ: dict[str, str] | None = None) -> None:
    """Write ``code`` to ``$ELASTICDL_EXIT_STATUS_FILE`` (if set)."""
    path = (os.environ if environ is None else environ).get(EXIT_STATUS_FILE_ENV, "")
    if not path:
        return
    try:
        write_atomically(path, f"{code}\n")
    except OSError as e:
        logger.warning("cannot record the exit status in %s: %s", path, e)


def read_exit_status(path: str | os.PathLike) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None
