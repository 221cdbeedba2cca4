"""initializers: the same initial rows from the native kernel and from the NumPy reference."""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from elasticdl.ops import _backend
from elasticdl.ps import initializers
from elasticdl.ps.embedding_table import EmbeddingTable

NAMES = ["uniform", "random_uniform", "glorot_uniform", "normal", "truncated_normal"]
NAMES += ["glorot_normal", "zeros", "ones"]
IDS = [0, 1, 2**62, 7, 7, -5, 123456789, 3]

# sha256 (16 hex digits) of initial_values(name, table_seed("user"), IDS, dim), recorded from
# the NumPy generator before the native kernel existed.
PINNED = {
    ("uniform", 3): "0950adaf4e847000",
    ("uniform", 16): "ded65d25289377f6",
    ("glorot_uniform", 3): "a1c72bf2f1f75c91",
    ("glorot_uniform", 16): "1db2a271b1d9d5d3",
    ("normal", 3): "dc491c0385380197",
    ("normal", 16): "60247b6e51cfe6d7",
    ("truncated_normal", 16): "fc38db9c0e395494",
    ("glorot_normal", 3): "fd0bc444e4f7cff1",
    ("glorot_normal", 16): "159d8cf781cfc09f",
}

# Prints, as JSON, the digest of every table's rows for every initializer in this backend.
_ROWS_DIGESTS = """
import hashlib, json, numpy as np
from elasticdl.ops import _backend
from elasticdl.ps.embedding_table import EmbeddingTable
rng = np.random.default_rng(2)
batches = [rng.integers(0, 5000, 3000), np.array([2**62, 0, 2**62]), rng.integers(0, 2**40, 20000)]
out = {"backend": _backend.name()}
for name in %r:
    for dim in (1, 3, 16, 65):
        t = EmbeddingTable("user", dim, name)
        for ids in batches:
            t.get(ids)
        ids, values = t.export()
        out[f"{name}/{dim}"] = hashlib.sha256(ids.tobytes() + values.tobytes()).hexdigest()
print(json.dumps(out))
""" % (
    NAMES,
)


def _rows_digests(backend_env):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("ELASTICDL_OPS_BACKEND", None)
    env.update(backend_env)
    r = subprocess.run(
        [sys.executable, "-c", _ROWS_DIGESTS],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_initial_values_are_pinned():
    seed = initializers.table_seed("user")
    assert seed == 396807507848058987
    for (name, dim), digest in PINNED.items():
        values = initializers.initial_values(name, seed, np.array(IDS), dim)
        assert values.dtype == np.float32 and values.shape == (len(IDS), dim)
        assert hashlib.sha256(values.tobytes()).hexdigest()[:16] == digest, (name, dim)


@pytest.mark.skipif(_backend.native is None, reason="elasticdl_native not loaded")
def test_tables_grow_the_same_rows_with_the_native_and_the_reference_backend():
    native = _rows_digests({})
    reference = _rows_digests({"ELASTICDL_OPS_BACKEND": "reference"})
    assert native.pop("backend") == "native" and reference.pop("backend") == "reference"
    assert native == reference


def test_uniform_initial_values_lie_within_the_limit():
    ids = np.arange(10_000)
    values = initializers.initial_values("uniform", 5, ids, 8)
    assert np.abs(values).max() <= 0.05 and np.abs(values).max() > 0.049
    glorot = initializers.initial_values("GlorotUniform", 5, ids, 8)
    assert np.abs(glorot).max() <= np.float32(np.sqrt(6.0 / 16))


def test_a_tables_new_rows_are_the_initial_values_of_their_ids():
    """Whatever order the rows come in, each is its id's initial value (the subprocess above
    builds tables the same way)."""
    ids = np.array([2**62, 5, 0, 5, 9], np.int64)
    table = EmbeddingTable("user", 8, "uniform")
    table.get(ids[:2])
    got = table.get(ids)
    want = initializers.initial_values("uniform", initializers.table_seed("user"), ids, 8)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
