"""counter_rng: the native fill gives the NumPy reference's bits, and those bits are pinned."""
import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
from elasticdl.ops import _backend, counter_rng

native = pytest.mark.skipif(_backend.native is None, reason="elasticdl_native not loaded")

DIMS = [1, 3, 8, 16, 64, 65]
# 0, 2**64 - 1 and the seed of a table named "user" (elasticdl.ps.initializers.table_seed).
SEEDS = [0, 2**64 - 1, 396807507848058987]
EDGE_IDS = np.array([0, 1, 2**62, 7, 7, -5, 123456789, 3, 2**63 - 1, -(2**63)], np.int64)


def _id_sets():
    rng = np.random.default_rng(3)
    yield np.zeros(0, np.int64)
    yield np.array([0], np.int64)
    yield EDGE_IDS
    yield rng.integers(0, 500, 1000)  # unsorted, repeated
    yield rng.integers(-(2**62), 2**62, 100_000)


def _limits(dim):
    # A Python float ("uniform") and a NumPy float64 (glorot_uniform), as the initializers pass.
    return [0.05, np.sqrt(6.0 / (2.0 * dim))]


def _same_bits(a, b):
    return a.dtype == b.dtype == np.float32 and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def _digest(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


@native
@pytest.mark.parametrize("seed", SEEDS)
def test_native_uniforms_are_the_reference_bits(seed):
    for ids in _id_sets():
        for dim in DIMS if ids.size <= 1000 else [1, 16, 65]:
            for stream in (0, 1, 5):
                got = counter_rng.uniform01(seed, ids, dim, stream)
                assert got.shape == (ids.size, dim)
                assert _same_bits(got, counter_rng.reference_uniform01(seed, ids, dim, stream))
            for limit in _limits(dim):
                got = counter_rng.scaled_uniform(seed, ids, dim, limit)
                want = counter_rng.reference_scaled_uniform(seed, ids, dim, limit)
                assert _same_bits(got, want), (ids.size, dim, limit)


@native
def test_a_limit_multiplied_in_double_is_rounded_once_to_float32():
    """NumPy 2 multiplies a float32 array by a NumPy float64 in double: the native kernel's
    double product (which NumPy 1 never asks for) is the double product rounded to float32."""
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 2**40, 5000)
    for limit in (np.sqrt(6.0 / 6.0), 0.05, 1e-3):
        u = counter_rng.reference_uniform01(9, ids, 8, 0)
        want = ((2.0 * u - 1.0).astype(np.float64) * np.float64(limit)).astype(np.float32)
        got = _backend.native.cpu_uniform_scaled(9, ids, 8, float(limit), True)
        assert _same_bits(got, want)
        single = _backend.native.cpu_uniform_scaled(9, ids, 8, float(limit), False)
        assert _same_bits(single, (2.0 * u - 1.0) * np.float32(limit))


@native
def test_native_uniforms_are_exact_on_seven_threads():
    """Past the size where the fill runs on a team, each thread's slice of rows is the
    reference's (OMP_NUM_THREADS is read at start-up, hence a subprocess)."""
    code = (
        "import numpy as np, elasticdl_native as N\n"
        "from elasticdl.ops import counter_rng as C\n"
        "assert N.num_threads() == 7\n"
        "ids = np.random.default_rng(6).integers(0, 2**50, 100_003)\n"
        "for dim in (3, 16):\n"
        "    a, b = C.scaled_uniform(11, ids, dim, 0.05), C.reference_scaled_uniform(11, ids, dim, 0.05)\n"
        "    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))\n"
        "    a, b = C.uniform01(11, ids, dim, 2), C.reference_uniform01(11, ids, dim, 2)\n"
        "    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))\n"
    )
    env = dict(
        os.environ, OMP_NUM_THREADS="7", OMP_DYNAMIC="false", PYTHONPATH=os.pathsep.join(sys.path)
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)


def test_the_uniforms_are_pinned():
    """The values existing tables were initialised with (recorded from the NumPy generator
    before the native kernel existed): neither implementation may drift."""
    for fn in (counter_rng.uniform01, counter_rng.reference_uniform01):
        assert _digest(fn(2**64 - 1, EDGE_IDS[:8], 5, 3)) == "0392c5793f8983c7"
    for fn in (counter_rng.scaled_uniform, counter_rng.reference_scaled_uniform):
        assert _digest(fn(396807507848058987, EDGE_IDS[:8], 16, 0.05)) == "ded65d25289377f6"
        glorot = np.sqrt(6.0 / (2.0 * 3))
        assert _digest(fn(396807507848058987, EDGE_IDS[:8], 3, glorot)) == "a1c72bf2f1f75c91"


def test_uniform01_at_picks_single_values():
    ids = np.array([5, 2**62, 5], np.int64)
    cols = np.array([0, 7, 2])
    block = counter_rng.reference_uniform01(1, ids, 8, 4)
    np.testing.assert_array_equal(
        counter_rng.uniform01_at(1, ids, cols, 8, 4), block[np.arange(3), cols]
    )


def test_dim_must_be_positive():
    for fn in (counter_rng.uniform01, counter_rng.reference_uniform01):
        with pytest.raises(ValueError, match="dim must be >= 1"):
            fn(0, np.arange(3), 0, 0)


def test_counter_rng_loads_without_protobuf():
    """The light image has no protobuf: the initial values' kernels come with elasticdl.ops."""
    code = (
        "import sys; sys.modules['google'] = sys.modules['google.protobuf'] = None; "
        "import numpy as np; from elasticdl.ops import counter_rng; "
        "print(counter_rng.scaled_uniform(1, np.arange(4), 3, 0.05).shape)"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "(4, 3)"
