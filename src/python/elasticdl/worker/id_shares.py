"""Embedding rows split among the PS by owner (row `id` lives on PS `id % num_ps`) and put back
together: the worker does both for every pull and push, so they are written for speed in
NumPy (what each choice saves: benchmarks/runtime/README.md, "2 PS").

* The owner is computed once per call, as a bit mask where `num_ps` is a power of two (the same
  floor modulo as `%` for any int64, negative ones included, without a division).
* Rows are split with `np.compress` along axis 0, several times cheaper than a boolean index of a
  2-D array.
* Rows are put back as one fixed-size item per row (a void view), a cheaper fancy assignment
  than NumPy's row-by-row one.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np


def owners(ids: np.ndarray, num_ps: int) -> np.ndarray:
    """`ids % num_ps` (int64 ids)."""
    if num_ps & (num_ps - 1) == 0:
        return ids & (num_ps - 1)
    return ids % num_ps


def owner_masks(ids: np.ndarray, num_ps: int) -> List[np.ndarray]:
    """Per PS, which of `ids` it owns."""
    owner = owners(ids, num_ps)
    return [owner == ps_id for ps_id in range(num_ps)]


def split_rows(
    values: np.ndarray, ids: np.ndarray, num_ps: int
) -> List[Optional[Tuple[np.ndarray, np.ndarray]]]:
    """Per PS, (its rows of `values`, its ids) in their order in `ids`; None for a PS that owns
    none of them."""
    shares: List[Optional[Tuple[np.ndarray, np.ndarray]]] = []
    for mask in owner_masks(ids, num_ps):
        if mask.any():
            shares.append((np.compress(mask, values, axis=0), np.compress(mask, ids)))
        else:
            shares.append(None)
    return shares


def put_rows(out: np.ndarray, positions: np.ndarray, rows: np.ndarray) -> None:
    """`out[positions] = rows` for 2-D arrays of one dtype."""
    if (
        out.ndim == 2
        and rows.ndim == 2
        and out.dtype == rows.dtype
        and out.shape[1] == rows.shape[1]
        and out.shape[1] > 0
        and out.flags.c_contiguous
        and rows.flags.c_contiguous
    ):
        _row_items(out)[positions] = _row_items(rows)
    else:
        out[positions] = rows


def _row_items(a: np.ndarray) -> np.ndarray:
    """A C-contiguous 2-D array as a 1-D array of one opaque item per row (no copy)."""
    return a.view(np.dtype((np.void, a.shape[1] * a.itemsize))).reshape(-1)
