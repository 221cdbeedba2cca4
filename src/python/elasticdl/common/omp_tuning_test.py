"""passive_omp_wait() checked by what libgomp itself reports (OMP_DISPLAY_ENV=VERBOSE: how many
times an idle thread spins before it sleeps) in a fresh interpreter that loads the native
kernels and runs one multi-threaded lookup."""
import os
import subprocess
import sys

import pytest
from elasticdl.common.omp_tuning import passive_omp_wait

_CHILD = r"""
import sys
from elasticdl.common.omp_tuning import passive_omp_wait
took = passive_omp_wait() if sys.argv[1] == "tuned" else None
import numpy as np
from elasticdl.ops import _backend
assert _backend.native is not None, "the native kernels are not importable"
from elasticdl import ops
table = np.ones((70000, 16), np.float32)
rows = ops.embedding_lookup(table, np.arange(70000))  # above the kernel's parallel threshold
assert rows.shape == (70000, 16) and rows.sum() == 70000 * 16
print(took)
"""


def _run(mode: str, **env_extra) -> tuple[str, str]:
    env = dict(os.environ)
    for var in ("OMP_WAIT_POLICY", "ELASTICDL_OMP_PASSIVE", "ELASTICDL_OPS_BACKEND"):
        env.pop(var, None)
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
        OMP_DISPLAY_ENV="VERBOSE",
        OMP_NUM_THREADS="2",
        **env_extra,
    )
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    spins = [line for line in out.stderr.splitlines() if "GOMP_SPINCOUNT" in line]
    assert spins, out.stderr[-2000:]
    return out.stdout.strip(), spins[0]


def test_libgomp_loads_with_passive_waiting():
    took, spins = _run("tuned")
    assert took == "True"
    assert "GOMP_SPINCOUNT = '0'" in spins


def test_without_it_libgomp_keeps_its_spinning_default():
    took, spins = _run("plain")
    assert took == "None"
    assert "GOMP_SPINCOUNT = '0'" not in spins


@pytest.mark.parametrize(
    "env_extra", [{"OMP_WAIT_POLICY": "ACTIVE"}, {"ELASTICDL_OMP_PASSIVE": "0"}]
)
def test_the_users_choice_wins(env_extra):
    took, spins = _run("tuned", **env_extra)
    assert took == "False"
    assert "GOMP_SPINCOUNT = '0'" not in spins


def test_too_late_once_the_kernels_are_loaded():
    env = {}
    assert passive_omp_wait(env, modules={"elasticdl_native": object()}) is False
    assert env == {}
    assert passive_omp_wait(env, modules={}) is True
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}
