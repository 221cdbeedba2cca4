"""The interface every ``elasticdl.ops`` backend implements, and the optimizer spec it takes.

A backend serves arrays of one kind: the NumPy reference (:class:`~elasticdl.ops.reference.
ReferenceBackend`, the oracle), the C++/OpenMP CPU kernels (``_native_cpu.NativeCpuBackend``)
and the CUDA kernels (``_cuda.CudaBackend``). Each derives from :class:`OpsBackend` and is
registered by name with :func:`register` (``elasticdl/ops/__init__.py`` does it); the public
functions of :mod:`elasticdl.ops` pick one by where their arrays live and call it.

Optimizer updates take an :class:`OptimizerSpec`: the kind and the hyperparameters that stay
fixed during training. The learning rate and Adam's step change from call to call (staleness
modulation, per-request rates, the model version), so they are arguments of the call. Build a
spec once -- :meth:`OptimizerSpec.create` from a name such as the PS's ``--opt_type`` -- and
pass it to every update: the backends read only precomputed attributes of it.
"""

from __future__ import annotations

import abc
import enum
import functools
import math
from dataclasses import dataclass, field

from elasticdl.ops.errors import OpsError


class OptKind(enum.IntEnum):
    """The optimizers the kernels apply. The values are the native kernels' codes
    (``edl::OptKind`` in ``src/cc/kernels.h``)."""

    SGD = 0
    MOMENTUM = 1
    ADAM = 2
    ADAGRAD = 3

    @property
    def label(self) -> str:
        """The conventional (Keras) spelling: "SGD", "Momentum", "Adam", "Adagrad"."""
        return _KIND_INFO[self][0]

    @property
    def hyperparameters(self) -> tuple[str, ...]:
        """The :class:`OptimizerSpec` fields this kind reads."""
        return _KIND_INFO[self][1]

    @classmethod
    def parse(cls, name) -> OptKind:
        """The kind named ``name`` (case-insensitive label, e.g. "adam"), or an OptKind."""
        if isinstance(name, OptKind):
            return name
        kind = _KIND_BY_NAME.get(str(name).strip().lower())
        if kind is None:
            raise OpsError(
                f"optimizer {name!r} is not supported; use one of "
                f"{', '.join(k.label for k in OptKind)}"
            )
        return kind


# kind -> (label, hyperparameters it reads, slot names (Keras), slot argument names of the
# elasticdl.ops functions, used in error messages).
_KIND_INFO = {
    OptKind.SGD: ("SGD", (), (), ()),
    OptKind.MOMENTUM: ("Momentum", ("momentum", "nesterov"), ("momentum",), ("velocity",)),
    OptKind.ADAM: (
        "Adam",
        ("beta_1", "beta_2", "epsilon", "amsgrad"),
        ("m", "v", "max_v"),
        ("m", "v", "max_v"),
    ),
    OptKind.ADAGRAD: ("Adagrad", ("epsilon",), ("accumulator",), ("accumulator",)),
}
_KIND_BY_NAME = {info[0].lower(): kind for kind, info in _KIND_INFO.items()}


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer kind and its fixed hyperparameters (Keras names and defaults); fields the
    kind does not read (:attr:`OptKind.hyperparameters`) are ignored.

    ``slot_names`` are the per-parameter state arrays the kind keeps, in the order
    :meth:`OpsBackend.dense_update` / :meth:`OpsBackend.sparse_update` take them (Keras names:
    "momentum"; "m", "v" and with AMSGrad "max_v"; "accumulator"), each shaped like the
    parameter and zero-initialised (Adagrad's accumulator: any non-negative start value).
    """

    kind: OptKind
    momentum: float = 0.0
    nesterov: bool = False
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-7
    amsgrad: bool = False
    slot_names: tuple[str, ...] = field(init=False, compare=False)
    # Derived once here so that a backend's per-call work is attribute reads: the names of the
    # slots in error messages, and the scalars of the native entry points after the learning
    # rate (momentum, nesterov, beta_1, beta_2, epsilon, amsgrad).
    slot_args: tuple[str, ...] = field(init=False, repr=False, compare=False)
    native_scalars: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        setattr_ = object.__setattr__  # frozen: fields are normalised once, here
        kind = OptKind.parse(self.kind)
        setattr_(self, "kind", kind)
        for name in ("momentum", "beta_1", "beta_2", "epsilon"):
            setattr_(self, name, float(getattr(self, name)))
        for name in ("nesterov", "amsgrad"):
            setattr_(self, name, bool(getattr(self, name)))
        _, _, slots, args = _KIND_INFO[kind]
        if kind is OptKind.ADAM and not self.amsgrad:
            slots, args = slots[:2], args[:2]
        setattr_(self, "slot_names", slots)
        setattr_(self, "slot_args", args)
        setattr_(
            self,
            "native_scalars",
            (self.momentum, self.nesterov, self.beta_1, self.beta_2, self.epsilon, self.amsgrad),
        )

    @classmethod
    def create(cls, kind, **hyperparameters) -> OptimizerSpec:
        """The spec of ``kind`` (an :class:`OptKind` or its name, e.g. the PS's ``--opt_type``)
        from a superset of hyperparameters: those the kind does not read are dropped."""
        kind = OptKind.parse(kind)
        return cls(
            kind, **{k: hyperparameters[k] for k in kind.hyperparameters if k in hyperparameters}
        )


# Specs of the per-optimizer functions (``elasticdl.ops.adam(...)`` and the reference's). They
# take their hyperparameters on every call; a cache keyed by them keeps those calls from
# building a spec each time.
SGD_SPEC = OptimizerSpec(OptKind.SGD)


def _cached(build):
    """``build`` memoised on its arguments; unhashable ones (0-d arrays) get a fresh spec."""
    cached = functools.lru_cache(maxsize=64)(build)

    @functools.wraps(build)
    def spec(*args) -> OptimizerSpec:
        try:
            return cached(*args)
        except TypeError:
            return build(*args)

    return spec


@_cached
def momentum_spec(momentum, nesterov=False) -> OptimizerSpec:
    return OptimizerSpec(OptKind.MOMENTUM, momentum=momentum, nesterov=nesterov)


@_cached
def adam_spec(beta_1, beta_2, epsilon, amsgrad=False) -> OptimizerSpec:
    return OptimizerSpec(
        OptKind.ADAM, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, amsgrad=amsgrad
    )


@_cached
def adagrad_spec(epsilon) -> OptimizerSpec:
    return OptimizerSpec(OptKind.ADAGRAD, epsilon=epsilon)


def adam_lr_t(lr, beta1, beta2, step) -> float:
    """Adam's bias-corrected step size at 1-based ``step``, in double precision (every backend
    computes it this way, so their float32 updates agree bit for bit)."""
    return float(lr) * math.sqrt(1.0 - float(beta2) ** step) / (1.0 - float(beta1) ** step)


def slot_count_error(spec: OptimizerSpec, slots, like: str) -> OpsError:
    """The error for ``slots`` that do not match ``spec.slot_args`` in number, or hold None."""
    names = spec.slot_args
    if len(slots) == len(names):
        missing = names[[s is None for s in slots].index(True)]
        why = "when amsgrad=True" if missing == "max_v" else f"by {spec.kind.label}"
        return OpsError(f"{missing}: required {why} (a zero-initialised array like {like})")
    return OpsError(
        f"slots: {spec.kind.label} updates take {len(names)} slot arrays {names}, got {len(slots)}"
    )


class OpsBackend(abc.ABC):
    """One implementation of every ``elasticdl.ops`` kernel, for one kind of array.

    Argument semantics and errors are those of the public functions of :mod:`elasticdl.ops`
    (documented there); every backend gives the reference's results (bit for bit on
    element-wise updates and CPU sums). In-place ops write into the caller's arrays.
    """

    #: The name the backend is registered under.
    name: str = ""

    @abc.abstractmethod
    def embedding_lookup(self, table, ids, offsets=None, combiner=None, weights=None, out=None):
        """Rows ``table[ids]``, or bags of them pooled by ``combiner`` when ``offsets`` given."""

    @abc.abstractmethod
    def sparse_aggregate(self, ids, grads):
        """(sorted unique ids, rows of ``grads`` summed per id)."""

    @abc.abstractmethod
    def dense_accumulate(self, out, grads, scale=1.0):
        """``out += sum(grads) * scale`` in place; returns ``out``."""

    @abc.abstractmethod
    def dense_update(self, spec, param, grad, slots, lr, step=1):
        """One optimizer step on all of ``param``. ``slots``: a sequence of arrays shaped like
        ``param``, one per ``spec.slot_args``; ``step``: Adam's 1-based step (others ignore
        it)."""

    @abc.abstractmethod
    def sparse_update(self, spec, table, ids, grads, slots, lr, step=1, unique_ids=False):
        """One optimizer step on rows ``ids`` of the 2-D ``table`` (duplicate ids summed first);
        ``slots`` are shaped like ``table``. ``unique_ids=True``: the caller guarantees that no
        id repeats, so a backend may skip the summing (it may also ignore the hint)."""


_REGISTRY: dict[str, OpsBackend] = {}


def register(backend: OpsBackend) -> OpsBackend:
    """Adds ``backend`` under ``backend.name`` (replacing one of that name); returns it."""
    if not isinstance(backend, OpsBackend):
        raise TypeError(f"{type(backend).__name__} does not derive from OpsBackend")
    if not backend.name:
        raise ValueError(f"{type(backend).__name__} has no name")
    _REGISTRY[backend.name] = backend
    return backend


def registered() -> dict[str, OpsBackend]:
    """The registered backends by name (a copy)."""
    return dict(_REGISTRY)


def get(name: str) -> OpsBackend:
    backend = _REGISTRY.get(name)
    if backend is None:
        raise OpsError(f"no elasticdl.ops backend named {name!r}; registered: {sorted(_REGISTRY)}")
    return backend
