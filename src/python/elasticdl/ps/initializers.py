"""Deterministic initial values for lazily created embedding rows.

A row's initial value depends only on (table seed, row id, column), never on the order in which
rows are first requested or on how many parameter servers share the table. So a job restarted
from scratch, or a table re-sharded across a different number of PS, sees the same initial rows.
Values come from a counter-based generator (splitmix64 over id and column,
:mod:`elasticdl.ops.counter_rng`): the uniform ones in one native pass when the extension is
loaded, the normal ones from its uniforms by Box-Muller in NumPy (NumPy's float32 log and cos
are its own SIMD code, which C++ would not match bit for bit).

Supported names (Keras spelling, case-insensitive, CamelCase accepted):
  zeros, ones, uniform / random_uniform (U(-0.05, 0.05)), normal / random_normal (N(0, 0.05)),
  truncated_normal (N(0, 0.05) redrawn beyond 2 stddev), glorot_uniform, glorot_normal.
The Glorot variants are approximations: the vocabulary size (fan_in) of a lazily grown table
is unknown, so fan_in = fan_out = dim is used.
"""
from __future__ import annotations

import hashlib
import re
from typing import Callable

import numpy as np
from elasticdl.ops import counter_rng
from elasticdl.ps.errors import PSError

_DEFAULT_SCALE = 0.05


class UnknownInitializerError(PSError):
    pass


def table_seed(name: str, base_seed: int = 0) -> int:
    """A stable 64-bit seed per table name (Python's hash() is salted per process)."""
    digest = hashlib.sha256(f"{base_seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _box_muller(u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
    np.subtract(1.0, u1, out=u1)  # (0, 1]: keeps log() finite
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(np.float32(2.0 * np.pi) * u2)


def _normal(seed: int, ids: np.ndarray, dim: int, stream: int) -> np.ndarray:
    # Box-Muller on two independent uniform streams.
    return _box_muller(
        counter_rng.uniform01(seed, ids, dim, 2 * stream),
        counter_rng.uniform01(seed, ids, dim, 2 * stream + 1),
    )


def _uniform_init(limit: float):
    def init(seed, ids, dim):
        return counter_rng.scaled_uniform(seed, ids, dim, limit)

    return init


def _normal_init(stddev: float):
    def init(seed, ids, dim):
        return _normal(seed, ids, dim, 0) * stddev

    return init


def _truncated_normal_init(stddev: float):
    def init(seed, ids, dim):
        out = _normal(seed, ids, dim, 0)
        # Redraw the ~5% of values beyond two standard deviations (as Keras does), each round
        # from a fresh stream and only at those positions; stragglers after 8 rounds (~1e-10)
        # are clipped.
        for stream in range(1, 9):
            rows, cols = np.nonzero(np.abs(out) > 2.0)
            if rows.size == 0:
                break
            out[rows, cols] = _box_muller(
                counter_rng.uniform01_at(seed, ids[rows], cols, dim, 2 * stream),
                counter_rng.uniform01_at(seed, ids[rows], cols, dim, 2 * stream + 1),
            )
        return np.clip(out, -2.0, 2.0) * stddev

    return init


def _constant_init(value: float):
    def init(seed, ids, dim):
        return np.full((ids.shape[0], dim), value)

    return init


def _glorot_uniform(seed, ids, dim):
    return _uniform_init(np.sqrt(6.0 / (2.0 * dim)))(seed, ids, dim)


def _glorot_normal(seed, ids, dim):
    return _truncated_normal_init(np.sqrt(2.0 / (2.0 * dim)) / 0.87962566103423978)(seed, ids, dim)


_INITIALIZERS: dict[str, Callable] = {
    "zeros": _constant_init(0.0),
    "zero": _constant_init(0.0),
    "ones": _constant_init(1.0),
    "one": _constant_init(1.0),
    "uniform": _uniform_init(_DEFAULT_SCALE),
    "random_uniform": _uniform_init(_DEFAULT_SCALE),
    "normal": _normal_init(_DEFAULT_SCALE),
    "random_normal": _normal_init(_DEFAULT_SCALE),
    "truncated_normal": _truncated_normal_init(_DEFAULT_SCALE),
    "glorot_uniform": _glorot_uniform,
    "glorot_normal": _glorot_normal,
}


def normalize_name(name: str) -> str:
    """'RandomUniform' -> 'random_uniform'; '' means the Keras Embedding default 'uniform'."""
    name = (name or "uniform").strip()
    name = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()
    return name


def check_initializer(name: str) -> str:
    norm = normalize_name(name)
    if norm not in _INITIALIZERS:
        raise UnknownInitializerError(
            f"unknown embedding initializer {name!r}; use one of {sorted(_INITIALIZERS)}"
        )
    return norm


def initial_values(name: str, seed: int, ids: np.ndarray, dim: int) -> np.ndarray:
    """float32 (len(ids), dim) initial rows for `ids` with initializer `name`."""
    # A table keeps its initializer's name normalized: the regex runs only for other callers.
    fn = _INITIALIZERS.get(name) or _INITIALIZERS[check_initializer(name)]
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    return np.asarray(fn(seed, ids, dim), dtype=np.float32).reshape(ids.shape[0], dim)
