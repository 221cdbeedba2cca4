"""Which parameter server owns what.

Dense parameters are placed whole on one PS chosen by a hash of their name; embedding rows are
spread over all PS by `id % num_ps`. The name hash copies the original ElasticDL exactly,
including its quirk of parsing the sha256 *hex* digest as a base-32 number, so checkpoints and
placements stay compatible with it.
"""
from __future__ import annotations

import hashlib

import numpy as np


def string_to_id(name: str, num_buckets: int) -> int:
    if num_buckets <= 0:
        raise ValueError(f"num_buckets must be positive, got {num_buckets}")
    return int(hashlib.sha256(name.encode("utf-8")).hexdigest(), base=32) % num_buckets


def ids_to_ps(ids: np.ndarray, num_ps: int) -> np.ndarray:
    """PS index for every embedding row id (ids may be negative only by mistake: rejected)."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and ids.min() < 0:
        raise ValueError(f"embedding ids must be non-negative, got {int(ids.min())}")
    return ids % num_ps


def scatter_embedding_vector(values: np.ndarray, ids: np.ndarray, num_ps: int):
    """Group rows by owning PS: {ps_index: (values_subset, ids_subset)}, order preserved."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    owner = ids_to_ps(ids, num_ps)
    out = {}
    for ps in range(num_ps):
        mask = owner == ps
        if mask.any():
            out[ps] = (values[mask], ids[mask])
    return out
