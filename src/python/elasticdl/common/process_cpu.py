"""A process's own CPU seconds, as workers and PS report them to the master.

The master sizes ``--num_workers=auto`` jobs by the CPU their replicas use. Replicas on the
master's host are read from /proc; pods on other nodes are not readable from the master, so
each replica sends its own reading: a worker with every task report (the counter below, in
milliseconds), a PS with its load report. The reading is cumulative since the process started,
so a lost or repeated report changes nothing: the master takes differences.
"""
from __future__ import annotations

import os

# exec_counters key of ReportTaskResultRequest: the worker process's CPU ms so far.
PROCESS_CPU_MS_COUNTER = "process_cpu_ms"


def own_cpu_seconds() -> float:
    """This process's user + system CPU seconds (all its threads), without reaped children."""
    t = os.times()
    return t.user + t.system
