"""Optimizers the PS applies to its dense parameters and embedding rows.

Configured from the PS flags `--opt_type` (SGD | Momentum | Adam | Adagrad, case-insensitive)
and `--opt_args` ("learning_rate=0.1;momentum=0.9;nesterov=true;" -- the original syntax). The
math runs in `elasticdl.ops` kernels (C++ when built, NumPy otherwise): the config becomes an
`elasticdl.ops.OptimizerSpec` once, and this module keeps the slots the spec names:

  SGD       p -= lr g
  Momentum  v = mu v + g; p -= lr v             (Nesterov: p -= lr (g + mu v))
  Adam      Keras-style bias correction lr_t = lr sqrt(1-b2^t)/(1-b1^t), p -= lr_t m/(sqrt(v)+eps),
            AMSGrad uses max(v) seen so far
  Adagrad   acc += g^2; p -= lr g/(sqrt(acc)+eps)

Slots are named after Keras: "momentum", "m", "v", "max_v", "accumulator".
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import numpy as np
from elasticdl import ops
from elasticdl.common import spec_codec
from elasticdl.ops import OptimizerSpec, OptKind
from elasticdl.ps.embedding_table import EmbeddingTable, strictly_increasing
from elasticdl.ps.errors import PSError
from elasticdl.ps.parameters import Parameters

logger = logging.getLogger(__name__)

# Below this many ids the check that they strictly increase costs as much as ranking them in
# the kernel (figures: benchmarks/ps/README.md).
_UNRANKED_MIN = 256


class OptimizerConfigError(PSError):
    pass


@dataclass
class OptimizerConfig:
    opt_type: str = "SGD"
    learning_rate: float = 0.01
    momentum: float = 0.0
    nesterov: bool = False
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-7
    amsgrad: bool = False
    initial_accumulator_value: float = 0.0

    def __post_init__(self):
        try:
            kind = OptKind.parse(self.opt_type)
        except ops.OpsError:
            raise OptimizerConfigError(
                f"--opt_type {self.opt_type!r} is not supported; use one of "
                f"{', '.join(k.label for k in OptKind)}"
            ) from None
        self.opt_type = kind.label
        if self.learning_rate < 0:
            raise OptimizerConfigError(f"learning_rate must be >= 0, got {self.learning_rate}")
        if not 0.0 <= self.momentum < 1.0 + 1e-12:
            raise OptimizerConfigError(f"momentum must be in [0, 1], got {self.momentum}")
        for key in ("beta_1", "beta_2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise OptimizerConfigError(f"{key} must be in [0, 1), got {getattr(self, key)}")
        if self.epsilon < 0:
            raise OptimizerConfigError(f"epsilon must be >= 0, got {self.epsilon}")
        if self.initial_accumulator_value < 0:
            raise OptimizerConfigError(
                f"initial_accumulator_value must be >= 0, got {self.initial_accumulator_value}"
            )

    @property
    def kind(self) -> OptKind:
        return OptKind.parse(self.opt_type)

    def used_keys(self) -> set[str]:
        """The fields this optimizer reads: the learning rate, the hyperparameters of its
        kernels, and Adagrad's start value of the accumulator slot (set by the PS)."""
        kind = self.kind
        keys = {"learning_rate", *kind.hyperparameters}
        if kind is OptKind.ADAGRAD:
            keys.add("initial_accumulator_value")
        return keys

    def spec(self) -> OptimizerSpec:
        """The kernels' view of this optimizer: its kind and fixed hyperparameters."""
        return OptimizerSpec.create(self.kind, **dataclasses.asdict(self))


_ALIASES = {"lr": "learning_rate", "beta1": "beta_1", "beta2": "beta_2"}


def parse_bool(text: str, key: str) -> bool:
    try:
        return spec_codec.parse_bool(text)
    except ValueError:
        raise OptimizerConfigError(
            f"opt_args key {key!r}: {text!r} is not a boolean (true/false)"
        ) from None


def parse_optimizer_config(opt_type: str, opt_args: str) -> OptimizerConfig:
    """Parse `--opt_type`/`--opt_args` ("k=v;k=v;", spaces tolerated) into a config."""
    fields = {f.name: f for f in dataclasses.fields(OptimizerConfig) if f.name != "opt_type"}
    values: dict = {}
    for item in (opt_args or "").split(";"):
        item = item.strip()
        if not item:
            continue
        if "=" not in item:
            raise OptimizerConfigError(f"opt_args item {item!r} is not of the form key=value")
        key, raw = (part.strip() for part in item.split("=", 1))
        key = _ALIASES.get(key, key)
        field = fields.get(key)
        if field is None:
            raise OptimizerConfigError(
                f"opt_args key {key!r} is unknown; known keys: {', '.join(sorted(fields))}"
            )
        if field.type in (bool, "bool"):
            values[key] = parse_bool(raw, key)
        else:
            try:
                values[key] = float(raw)
            except ValueError:
                raise OptimizerConfigError(
                    f"opt_args key {key!r}: {raw!r} is not a number"
                ) from None
    config = OptimizerConfig(opt_type=opt_type, **values)
    # Other keys are accepted (the master may send a superset) but logged, since they usually
    # reveal a mismatch between --opt_type and --opt_args.
    unused = set(values) - config.used_keys()
    if unused:
        logger.warning("opt_args keys %s are ignored by %s", sorted(unused), config.opt_type)
    return config


class Optimizer:
    """Applies one (already validated and aggregated) gradient update.

    `step` is the 1-based Adam step; the PS passes its model version + 1, so the bias correction
    continues correctly after a restore from a checkpoint.
    """

    def __init__(self, config: OptimizerConfig):
        self.config = config
        # Built once: every update hands the kernels this same spec and slot list.
        self.spec = config.spec()
        init = config.initial_accumulator_value
        self._slots = tuple((s, init if s == "accumulator" else 0.0) for s in self.spec.slot_names)

    @property
    def slot_names(self) -> tuple[str, ...]:
        return self.spec.slot_names

    def apply_dense(self, params: Parameters, grads: dict[str, np.ndarray], lr: float, step: int):
        spec, slot_inits = self.spec, self._slots
        for name, grad in grads.items():
            slots = [params.dense_slot(s, name, init) for s, init in slot_inits]
            ops.dense_update(spec, params.dense[name], grad, slots, lr, step)

    def apply_sparse(
        self,
        table: EmbeddingTable,
        ids: np.ndarray,
        grads: np.ndarray,
        lr: float,
        step: int,
        ids_checked: bool = False,
    ):
        """Update rows `ids` (duplicates are summed by the kernel) of `table`. The kernels see
        block row numbers, not ids, so table and slots are plain contiguous 2-D arrays.
        `ids_checked`: `ids` passed `check_ids` already (a push's, in Parameters.check_grad)."""
        if ids.size == 0:
            return
        # Creates rows never pulled (e.g. after a PS restart).
        rows = table.rows(ids, checked=ids_checked)
        slots = [table.slot(s, init) for s, init in self._slots]
        # A worker sends each id once: in order when it summed them (ps_client), in a layer's
        # first-appearance order otherwise. Order is checked here, not trusted, since the
        # kernel races on a repeated row: strictly increasing ids have distinct rows, updated
        # straight from their gradients; any other order is ranked, which sums repeats.
        unique = ids.size >= _UNRANKED_MIN and strictly_increasing(ids)
        ops.sparse_update(self.spec, table.values, rows, grads, slots, lr, step, unique)
