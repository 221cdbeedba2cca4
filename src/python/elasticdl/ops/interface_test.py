"""The backend interface: every registered backend implements all of it, the optimizer spec, and
the reference and native backends agreeing through it for every optimizer kind."""

import inspect

import elasticdl.ops as ops
import numpy as np
import pytest
from elasticdl.ops import _backend
from elasticdl.ops import interface as B
from elasticdl.ops import reference as R

SPECS = {
    "sgd": B.OptimizerSpec(B.OptKind.SGD),
    "momentum": B.OptimizerSpec(B.OptKind.MOMENTUM, momentum=0.9),
    "nesterov": B.OptimizerSpec(B.OptKind.MOMENTUM, momentum=0.8, nesterov=True),
    "adam": B.OptimizerSpec(B.OptKind.ADAM, beta_1=0.8, beta_2=0.99, epsilon=1e-6),
    "amsgrad": B.OptimizerSpec(B.OptKind.ADAM, amsgrad=True),
    "adagrad": B.OptimizerSpec(B.OptKind.ADAGRAD, epsilon=1e-7),
}
INTERFACE = sorted(B.OpsBackend.__abstractmethods__)


def test_the_interface_is_the_five_ops():
    assert INTERFACE == [
        "dense_accumulate",
        "dense_update",
        "embedding_lookup",
        "sparse_aggregate",
        "sparse_update",
    ]


def test_backends_are_registered_explicitly():
    names = set(B.registered())
    assert {"reference", "cuda"} <= names
    assert ("native" in names) == (_backend.native is not None)
    assert B.get(ops.backend()) is B.registered()[ops.backend()]
    with pytest.raises(ops.OpsError, match="no elasticdl.ops backend named 'tpu'"):
        B.get("tpu")
    with pytest.raises(TypeError):
        B.register(object())


@pytest.mark.parametrize("name", sorted(B.registered()))
def test_every_registered_backend_implements_the_whole_interface(name):
    backend = B.registered()[name]
    assert isinstance(backend, B.OpsBackend) and backend.name == name
    assert not type(backend).__abstractmethods__
    for op in INTERFACE:
        want = list(inspect.signature(getattr(B.OpsBackend, op)).parameters.values())[1:]
        got = list(inspect.signature(getattr(backend, op)).parameters.values())
        assert [(p.name, p.default) for p in got] == [(p.name, p.default) for p in want], op


def test_spec_from_a_name_keeps_what_the_kind_reads():
    hyper = dict(momentum=0.9, nesterov=True, beta_1=0.5, beta_2=0.6, epsilon=1e-3, amsgrad=True)
    adam = B.OptimizerSpec.create(" ADAM ", learning_rate=0.1, **hyper)
    assert adam == B.OptimizerSpec(
        B.OptKind.ADAM, beta_1=0.5, beta_2=0.6, epsilon=1e-3, amsgrad=True
    )
    assert adam.momentum == 0.0 and adam.slot_names == ("m", "v", "max_v")
    assert B.OptimizerSpec.create("sgd", **hyper) == B.OptimizerSpec(B.OptKind.SGD)
    assert B.OptimizerSpec.create("Momentum", **hyper).slot_names == ("momentum",)
    assert B.OptimizerSpec.create("adagrad", **hyper).epsilon == 1e-3
    assert B.OptimizerSpec("adam").slot_names == ("m", "v")
    assert [k.label for k in B.OptKind] == ["SGD", "Momentum", "Adam", "Adagrad"]
    assert [int(k) for k in B.OptKind] == [0, 1, 2, 3]  # edl::OptKind in src/cc/kernels.h
    with pytest.raises(ops.OpsError, match="'RMSprop' is not supported; use one of SGD"):
        B.OptKind.parse("RMSprop")


def test_per_optimizer_functions_reuse_their_specs():
    assert B.adam_spec(0.9, 0.999, 1e-7, False) is B.adam_spec(0.9, 0.999, 1e-7, False)
    assert B.momentum_spec(np.float32(0.5), True) is B.momentum_spec(0.5, True)
    zero_d = B.adagrad_spec(np.array(1e-7))  # unhashable: built, not cached
    assert zero_d == B.adagrad_spec(1e-7)


def _dense_case(n=1003):
    rng = np.random.default_rng(0)
    p = rng.standard_normal(n).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    slots = [np.abs(rng.standard_normal(n)).astype(np.float32) for _ in range(3)]
    return p, g, slots


def _sparse_case(rows=257, dim=19, n=700):
    rng = np.random.default_rng(1)
    table = rng.standard_normal((rows, dim)).astype(np.float32)
    slots = [np.abs(rng.standard_normal((rows, dim))).astype(np.float32) for _ in range(3)]
    ids = np.minimum(rng.zipf(1.3, n) - 1, rows - 1)  # many duplicates
    grads = rng.standard_normal((n, dim)).astype(np.float32)
    return table, ids, grads, slots


def _other_backends():
    return [n for n in sorted(B.registered()) if n not in ("reference", "cuda")]


@pytest.mark.skipif(_backend.native is None, reason="needs the native CPU kernels")
@pytest.mark.parametrize("name", _other_backends())
@pytest.mark.parametrize("kind", sorted(SPECS))
def test_backends_agree_with_the_reference_through_the_interface(name, kind):
    spec, ref, other = SPECS[kind], B.get("reference"), B.get(name)
    k = len(spec.slot_names)
    p, g, s = _dense_case()
    p2, s2 = p.copy(), [x.copy() for x in s]
    for step in (1, 2, 3):
        ref.dense_update(spec, p, g, s[:k], 0.05, step)
        other.dense_update(spec, p2, g, s2[:k], 0.05, step)
    np.testing.assert_array_equal(p2, p)
    for a, b in zip(s2, s):
        np.testing.assert_array_equal(a, b)
    table, ids, grads, s = _sparse_case()
    t2, s2 = table.copy(), [x.copy() for x in s]
    for step in (1, 2):
        ref.sparse_update(spec, table, ids, grads, s[:k], 0.05, step)
        other.sparse_update(spec, t2, ids, grads, s2[:k], 0.05, step)
    np.testing.assert_array_equal(t2, table)
    for a, b in zip(s2, s):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", sorted(SPECS))
def test_public_updates_equal_the_per_optimizer_functions(kind):
    """ops.dense_update/sparse_update with a spec == ops.<optimizer>(...) with its arguments."""
    spec = SPECS[kind]
    k = len(spec.slot_names)
    p, g, s = _dense_case()
    p2, s2 = p.copy(), [x.copy() for x in s]
    ops.dense_update(spec, p, g, s[:k], 0.05, 2)
    table, ids, grads, ts = _sparse_case()
    t2, ts2 = table.copy(), [x.copy() for x in ts]
    ops.sparse_update(spec, table, ids, grads, ts[:k], 0.05, 2)
    if kind == "sgd":
        R.sgd(p2, g, 0.05)
        R.sparse_sgd(t2, ids, grads, 0.05)
    elif kind in ("momentum", "nesterov"):
        R.momentum(p2, g, s2[0], 0.05, spec.momentum, spec.nesterov)
        R.sparse_momentum(t2, ids, grads, ts2[0], 0.05, spec.momentum, spec.nesterov)
    elif kind in ("adam", "amsgrad"):
        args = (0.05, spec.beta_1, spec.beta_2, spec.epsilon, 2, spec.amsgrad)
        R.adam(p2, g, s2[0], s2[1], *args, max_v=s2[2])
        R.sparse_adam(t2, ids, grads, ts2[0], ts2[1], *args, max_v=ts2[2])
    else:
        R.adagrad(p2, g, s2[0], 0.05, spec.epsilon)
        R.sparse_adagrad(t2, ids, grads, ts2[0], 0.05, spec.epsilon)
    np.testing.assert_array_equal(p, p2)
    np.testing.assert_array_equal(table, t2)
    for a, b in zip(s + ts, s2 + ts2):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", sorted(set(B.registered()) - {"cuda"}))
def test_slot_errors(name):
    backend = B.get(name)
    p, g, s = _dense_case(8)
    with pytest.raises(ops.OpsError, match=r"Adam updates take 2 slot arrays \('m', 'v'\), got 1"):
        backend.dense_update(SPECS["adam"], p, g, s[:1], 0.1, 1)
    with pytest.raises(ops.OpsError, match="max_v: required when amsgrad=True"):
        backend.dense_update(SPECS["amsgrad"], p, g, [s[0], s[1], None], 0.1, 1)
    with pytest.raises(ops.OpsError, match="velocity: required by Momentum"):
        backend.sparse_update(
            SPECS["momentum"], p.reshape(2, 4), [1], g[:4].reshape(1, 4), [None], 0.1
        )
    with pytest.raises(ops.OpsError, match="step"):
        backend.dense_update(SPECS["adam"], p, g, s[:2], 0.1, 0)
    assert np.array_equal(p, _dense_case(8)[0])  # nothing applied


def test_the_ops_load_without_protobuf():
    """The light image holds numpy and the framework's native kernels, no protobuf: importing
    elasticdl.ops must not reach the message modules (the push codec is plugged in by the PS
    and the worker instead)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['google'] = sys.modules['google.protobuf'] = None; "
        "import elasticdl.ops as ops; print(ops.backend())"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() in ("native", "reference")
