"""Optimizer numerics against a plain float64 NumPy reference written here (not elasticdl.ops)."""
import numpy as np
import pytest
from elasticdl.ps import optimizer
from elasticdl.ps.embedding_table import EmbeddingTable
from elasticdl.ps.optimizer import (
    Optimizer,
    OptimizerConfig,
    OptimizerConfigError,
    parse_optimizer_config,
)
from elasticdl.ps.parameters import Parameters

CONFIGS = {
    "sgd": ("SGD", "learning_rate=0.1;"),
    "momentum": ("Momentum", "learning_rate=0.1;momentum=0.9;nesterov=false;"),
    "nesterov": ("momentum", "learning_rate=0.1;momentum=0.9;nesterov=true;"),
    "adam": ("Adam", "learning_rate=0.01;beta_1=0.8;beta_2=0.99;epsilon=1e-6;amsgrad=false;"),
    "amsgrad": ("ADAM", "learning_rate=0.01;beta_1=0.8;beta_2=0.99;epsilon=1e-6;amsgrad=true;"),
    "adagrad": ("Adagrad", "learning_rate=0.1;epsilon=1e-7;initial_accumulator_value=0.1;"),
}


class Reference:
    """Textbook update rules in float64 on one array; `state` keeps the slots."""

    def __init__(self, c: OptimizerConfig):
        self.c = c
        self.state = {}

    def step(self, key, p, g, lr, t):
        c, s = self.c, self.state.setdefault(key, {})
        if c.opt_type == "SGD":
            return p - lr * g
        if c.opt_type == "Momentum":
            v = c.momentum * s.get("v", 0.0) + g
            s["v"] = v
            return p - lr * (g + c.momentum * v) if c.nesterov else p - lr * v
        if c.opt_type == "Adam":
            m = c.beta_1 * s.get("m", 0.0) + (1 - c.beta_1) * g
            v = c.beta_2 * s.get("v", 0.0) + (1 - c.beta_2) * g * g
            s["m"], s["v"] = m, v
            if c.amsgrad:
                v = s["vhat"] = np.maximum(s.get("vhat", 0.0), v)
            lr_t = lr * np.sqrt(1 - c.beta_2**t) / (1 - c.beta_1**t)
            return p - lr_t * m / (np.sqrt(v) + c.epsilon)
        acc = s.get("acc", c.initial_accumulator_value) + g * g
        s["acc"] = acc
        return p - lr * g / (np.sqrt(acc) + c.epsilon)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_dense_updates_match_reference(kind):
    config = parse_optimizer_config(*CONFIGS[kind])
    opt, ref = Optimizer(config), Reference(config)
    rng = np.random.default_rng(0)
    params = Parameters()
    params.dense["w"] = rng.normal(size=(3, 5)).astype(np.float32)
    expected = params.dense["w"].astype(np.float64)
    for t in range(1, 6):
        g = rng.normal(size=(3, 5)).astype(np.float32)
        lr = 0.05 if t == 3 else config.learning_rate  # per-request lr override
        opt.apply_dense(params, {"w": g}, lr, t)
        expected = ref.step("w", expected, g.astype(np.float64), lr, t)
    np.testing.assert_allclose(params.dense["w"], expected, rtol=2e-5, atol=2e-6)
    assert set(params.dense_slots) == set(opt.slot_names)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_sparse_updates_with_duplicate_ids_match_reference(kind):
    config = parse_optimizer_config(*CONFIGS[kind])
    opt, ref = Optimizer(config), Reference(config)
    rng = np.random.default_rng(1)
    table = EmbeddingTable("emb", 4, "uniform")
    initial = {i: table.get(np.array([i]))[0].astype(np.float64) for i in (1, 5)}
    expected = dict(initial)
    for t in range(1, 5):
        ids = np.array([5, 1, 5, 9 + t])  # duplicates, plus a row never pulled before
        grads = rng.normal(size=(4, 4)).astype(np.float32)
        init_new = EmbeddingTable("emb", 4, "uniform").get(ids[3:])[0].astype(np.float64)
        opt.apply_sparse(table, ids, grads, config.learning_rate, t)
        summed = {1: grads[1], 5: grads[0] + grads[2], 9 + t: grads[3]}  # duplicates summed
        expected[9 + t] = init_new
        for i, g in summed.items():
            expected[i] = ref.step(i, expected[i], g.astype(np.float64), config.learning_rate, t)
    for i, value in expected.items():
        np.testing.assert_allclose(table.get(np.array([i]))[0], value, rtol=2e-5, atol=2e-6)
    assert set(table.slot_names) == set(opt.slot_names)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
@pytest.mark.parametrize(
    "ids",
    [
        [1, 5, 9, 40],  # strictly increasing: the kernel updates each row without ranking
        [1, 5, 5, 40],  # in order but repeated: must still be summed
        [40, 9, 5, 1],  # unique, out of order
    ],
)
def test_sparse_updates_of_ordered_and_repeated_ids_match_reference(kind, ids, monkeypatch):
    """The PS takes the unranked kernel only for ids it found strictly increasing; ids in
    order with a repeat, or unique ones out of order, go through the summing kernel."""
    monkeypatch.setattr(optimizer, "_UNRANKED_MIN", 1)  # a batch this small is ranked otherwise
    config = parse_optimizer_config(*CONFIGS[kind])
    opt, ref = Optimizer(config), Reference(config)
    rng = np.random.default_rng(2)
    table = EmbeddingTable("emb", 3, "uniform")
    ids = np.array(ids, dtype=np.int64)
    expected = {int(i): table.get(np.array([i]))[0].astype(np.float64) for i in (1, 5)}
    fresh = EmbeddingTable("emb", 3, "uniform")  # rows 9 and 40 are created by the push
    expected.update({int(i): fresh.get(np.array([i]))[0].astype(np.float64) for i in (9, 40)})
    for t in range(1, 4):
        grads = rng.normal(size=(ids.size, 3)).astype(np.float32)
        opt.apply_sparse(table, ids, grads, config.learning_rate, t)
        summed = {}
        for i, g in zip(ids.tolist(), grads.astype(np.float64)):
            summed[i] = summed.get(i, 0.0) + g
        for i, g in summed.items():
            expected[i] = ref.step(i, expected[i], g, config.learning_rate, t)
    for i in set(ids.tolist()):
        np.testing.assert_allclose(table.get(np.array([i]))[0], expected[i], rtol=2e-5, atol=2e-6)


def test_sparse_sgd_golden_values_from_original_kernel_test():
    # ids [1, 3, 3], grad -1, lr 0.1, zero rows -> row 1 = 0.1, row 3 = 0.2 (duplicates add up).
    table = EmbeddingTable("t", 2, "zeros")
    Optimizer(parse_optimizer_config("SGD", "learning_rate=0.1")).apply_sparse(
        table, np.array([1, 3, 3]), -np.ones((3, 2), np.float32), 0.1, 1
    )
    np.testing.assert_allclose(table.get(np.array([1, 3])), [[0.1, 0.1], [0.2, 0.2]], rtol=1e-6)


def test_parse_opt_args():
    c = parse_optimizer_config("adam", " lr = 0.5 ; beta1=0.7;beta_2=0.9 ;amsgrad=YES;;")
    assert (c.opt_type, c.learning_rate, c.beta_1, c.beta_2, c.amsgrad) == (
        "Adam",
        0.5,
        0.7,
        0.9,
        True,
    )
    assert parse_optimizer_config("SGD", "").learning_rate == 0.01
    with pytest.raises(OptimizerConfigError, match="opt_args key 'momentun' is unknown"):
        parse_optimizer_config("Momentum", "momentun=0.9")
    with pytest.raises(OptimizerConfigError, match="'learning_rate': 'fast' is not a number"):
        parse_optimizer_config("SGD", "learning_rate=fast")
    with pytest.raises(OptimizerConfigError, match="'nesterov': 'maybe' is not a boolean"):
        parse_optimizer_config("Momentum", "nesterov=maybe")
    with pytest.raises(OptimizerConfigError, match="--opt_type 'RMSprop' is not supported"):
        parse_optimizer_config("RMSprop", "")
    with pytest.raises(OptimizerConfigError, match="beta_1 must be in"):
        parse_optimizer_config("Adam", "beta_1=1.5")
    with pytest.raises(OptimizerConfigError, match="key=value"):
        parse_optimizer_config("SGD", "learning_rate")


def test_the_kind_becomes_one_ops_spec(monkeypatch, caplog):
    """--opt_type/--opt_args become an ops OptimizerSpec once; every update passes that spec."""
    from elasticdl import ops

    config = parse_optimizer_config("ADAM", "lr=0.1;momentum=0.9;beta_1=0.5;amsgrad=true")
    assert "opt_args keys ['momentum'] are ignored by Adam" in caplog.text
    opt = Optimizer(config)
    assert opt.spec == ops.OptimizerSpec(ops.OptKind.ADAM, beta_1=0.5, amsgrad=True)
    assert opt.slot_names == ("m", "v", "max_v")
    seen = []
    monkeypatch.setattr(ops, "dense_update", lambda spec, *args: seen.append(spec))
    monkeypatch.setattr(ops, "sparse_update", lambda spec, *args: seen.append(spec))
    params = Parameters()
    params.dense["w"] = np.zeros(3, np.float32)
    opt.apply_dense(params, {"w": np.ones(3, np.float32)}, 0.1, 1)
    opt.apply_sparse(
        EmbeddingTable("t", 2, "zeros"), np.array([1]), np.ones((1, 2), np.float32), 0.1, 1
    )
    assert len(seen) == 2 and all(s is opt.spec for s in seen)
    adagrad = Optimizer(parse_optimizer_config("adagrad", "initial_accumulator_value=0.3"))
    assert adagrad.spec.kind is ops.OptKind.ADAGRAD and adagrad.slot_names == ("accumulator",)
