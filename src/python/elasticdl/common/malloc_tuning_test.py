"""tune_malloc() measured by what it is for: page faults of recycled megabyte buffers.

Each case runs in a fresh interpreter (malloc state is per process) that allocates and frees a
message's worth of 1 MiB buffers (four alive at once, as a request, its decoded copy, a
response and its encoding are) 100 times, and reports its minor page faults. With glibc's
defaults the freed megabytes are returned to the kernel (unmapped, or trimmed from the top of the
heap) and every new buffer faults its 256 pages in again; with the tuning they are reused.
"""
import ctypes.util
import json
import os
import subprocess
import sys

import pytest
from elasticdl.common.malloc_tuning import tune_malloc

_CHILD = r"""
import json, resource, sys
tuned = False
if sys.argv[1] == "tuned":
    from elasticdl.common.malloc_tuning import tune_malloc
    tuned = tune_malloc()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):  # warm up: imports, first heap growth
    bytearray(1 << 20)
before = faults()
for _ in range(100):
    bufs = [bytearray(1 << 20) for _ in range(4)]  # zero-filled: touches every page
    del bufs
print(json.dumps({"tuned": tuned, "faults": faults() - before}))
"""


def _faults(mode: str) -> dict:
    env = dict(os.environ)
    for var in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "ELASTICDL_MALLOC_TUNING"):
        env.pop(var, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _is_glibc() -> bool:
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").gnu_get_libc_version
        return True
    except (OSError, AttributeError):
        return False


@pytest.mark.skipif(not _is_glibc(), reason="mallopt tuning is glibc-only")
def test_megabyte_buffers_are_recycled_without_page_faults():
    default = _faults("default")
    tuned = _faults("tuned")
    assert tuned["tuned"] is True
    assert default["faults"] >= 100 * 256  # at least one fresh megabyte per round
    assert tuned["faults"] < 2000


def test_switch_and_user_settings_are_respected():
    assert tune_malloc({"ELASTICDL_MALLOC_TUNING": "0"}) is False
    assert tune_malloc({"MALLOC_MMAP_THRESHOLD_": "131072"}) is False
    assert tune_malloc({"MALLOC_TRIM_THRESHOLD_": "0"}) is False
