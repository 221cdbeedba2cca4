"""Idle OpenMP threads sleep instead of spinning, in the processes that serve the PS.

The native kernels (`elasticdl.ops`) run OpenMP teams. libgomp's default keeps a team's idle
threads spinning (300,000 rounds) after every parallel region before they sleep. A PS runs its
kernels from many gRPC handler threads, and each such thread owns its own team: the spinning
threads of earlier teams then take the CPU that the current request, gRPC's own threads and
(on one host) the worker need, which made an embedding pull several times dearer in CPU and
about twice as slow (figures: benchmarks/ps/README.md, wire.py).

`passive_omp_wait()` sets `OMP_WAIT_POLICY=PASSIVE`: idle threads wait on a futex, and a team
wakes in microseconds, little next to a kernel worth a second thread. libgomp reads it once,
when it is loaded, so this must run before anything imports the native kernels. Skipped
(returns False) when the user chose `OMP_WAIT_POLICY`, when `ELASTICDL_OMP_PASSIVE=0`, or
when the kernels are loaded already (too late to take effect).
"""
from __future__ import annotations

import os
import sys

ENV_SWITCH = "ELASTICDL_OMP_PASSIVE"
NATIVE_MODULE = "elasticdl_native"


def passive_omp_wait(environ=None, modules=None) -> bool:
    """Set the policy above for this process; True when it will take effect."""
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if "OMP_WAIT_POLICY" in environ or NATIVE_MODULE in modules:
        return False
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True
