"""A whole job run while one of its worker processes is SIGKILLed, as a preempted pod is."""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable, Optional

from elasticdl.platform.base import ReplicaType


def run_killing_worker(
    job, ready: Callable[[], bool], timeout: float, worker: int = 0
) -> tuple[int, Optional[int]]:
    """``job.run()`` (a master ``Job`` on the local platform) while a thread SIGKILLs worker
    ``worker`` the first time ``ready()`` holds, within ``timeout`` seconds of the start.
    Returns the job's exit code and the killed pid: None when the worker had already exited
    when ``ready()`` held, or the job succeeded or the time ran out first."""
    killed: list[int] = []

    def killer():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and job.phase != "Succeeded":
            if ready():
                pid = job.platform.replica_pid(ReplicaType.WORKER, worker)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    code = job.run()
    thread.join(timeout=5)
    return code, killed[0] if killed else None
