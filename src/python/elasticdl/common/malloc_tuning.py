"""Keep large buffers on the heap in processes that move whole models per minibatch.

glibc serves an allocation above its mmap threshold (128 KiB at start, raised at most to the size
of the largest block freed so far) with a fresh `mmap`, and returns it to the kernel on `free`.
Every megabyte-sized buffer of a gRPC message, a protobuf `bytes` field or a NumPy copy then
costs 256 page faults and the kernel's zeroing of those pages, each time. The PS and the workers
allocate and free several such buffers per minibatch (the dense model and its gradients travel
whole), which nearly doubled a push-with-pull round trip of the README model (figures:
benchmarks/runtime/README.md).

`tune_malloc()` raises the mmap threshold to 64 MiB (fixed: no dynamic adjustment), so buffers up
to that size are recycled from the heap, and lets up to 256 MiB of free heap stay mapped before
glibc trims it. The cost is memory a process keeps after a peak, bounded by those numbers.
Skipped (returns False) on non-glibc C libraries, when `ELASTICDL_MALLOC_TUNING=0`, or when the
user already chose glibc's own `MALLOC_MMAP_THRESHOLD_` / `MALLOC_TRIM_THRESHOLD_` variables.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

logger = logging.getLogger(__name__)

ENV_SWITCH = "ELASTICDL_MALLOC_TUNING"
MMAP_THRESHOLD_BYTES = 64 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024

# mallopt(3) parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_malloc(environ=None) -> bool:
    """Apply the settings above to this process; True when they took effect."""
    environ = os.environ if environ is None else environ
    if environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if "MALLOC_MMAP_THRESHOLD_" in environ or "MALLOC_TRIM_THRESHOLD_" in environ:
        return False  # the user tuned glibc directly: theirs wins
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # glibc only (musl has no mallopt)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and ok
    if not ok:
        logger.debug("mallopt refused the ElasticDL malloc settings")
    return ok
