"""Replicas that are processes of their master end when it dies.

A local job's PS and workers are child processes of the master, each in its own session (so a
Ctrl-C in a terminal does not reach them and the master can stop each on its own). If the
master is killed (``kill -9``, OOM), they are re-parented and would linger: a PS serving a
model nobody reads, a worker retrying a master that is gone. The local platform names the
master's pid in ``$ELASTICDL_EXIT_WITH_PARENT``; a replica started so watches its parent and
stops itself once the parent is no longer that process. (On Kubernetes the master pod owns its
replicas' pods and the cluster's garbage collector removes them.)
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

logger = logging.getLogger(__name__)

EXIT_WITH_PARENT_ENV = "ELASTICDL_EXIT_WITH_PARENT"
POLL_SECONDS = 0.5
# After SIGTERM (the replica's own graceful stop) the process is ended this long later.
GRACE_SECONDS = 10.0


def exit_with_parent(environ: dict[str, str] | None = None) -> threading.Thread | None:
    """Start the watch if ``$ELASTICDL_EXIT_WITH_PARENT`` names this process's parent."""
    value = (os.environ if environ is None else environ).get(EXIT_WITH_PARENT_ENV, "")
    if not value.isdigit():
        return None
    parent = int(value)
    if os.getppid() != parent:  # already orphaned before we looked
        _stop(parent)
        return None
    thread = threading.Thread(target=_watch, args=(parent,), name="parent-watch", daemon=True)
    thread.start()
    return thread


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_SECONDS)
    _stop(parent)


def _stop(parent: int) -> None:
    logger.error("The master (pid %d) is gone: this replica stops", parent)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_SECONDS)
    os._exit(1)
