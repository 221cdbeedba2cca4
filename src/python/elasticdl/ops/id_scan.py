"""One pass over a request's embedding ids: what the PS checks before it trusts them.

The native extension reads the ids once for the smallest, the first one another PS owns and
whether they strictly increase; the NumPy below (the reference, and what serves without the
extension or with ELASTICDL_OPS_BACKEND=reference) takes a pass for each.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from elasticdl.ops import _backend


class IdScan(NamedTuple):
    min: int  # 0 for no ids
    first_foreign: int  # index of the first id with id % num_ps != ps_id; -1 when none
    increasing: bool  # every id larger than the one before (so none repeats)


def scan_ids(ids: np.ndarray, num_ps: int, ps_id: int) -> IdScan:
    """`ids`: a 1-D int64 array. Ownership is only looked at when no id is negative (a
    negative id is refused first, and `%` of one says nothing)."""
    if num_ps <= 0:
        raise ValueError(f"num_ps must be > 0, got {num_ps}")
    if _backend.native is not None:
        return IdScan(*_backend.native.scan_ids(ids, num_ps, ps_id))
    return reference_scan_ids(ids, num_ps, ps_id)


def reference_scan_ids(ids: np.ndarray, num_ps: int, ps_id: int) -> IdScan:
    if not ids.size:
        return IdScan(0, -1, True)
    lowest = int(ids.min())
    increasing = ids.size < 2 or bool((ids[1:] > ids[:-1]).all())
    first_foreign = -1
    if num_ps > 1 and lowest >= 0:
        foreign = np.flatnonzero(ids % num_ps != ps_id)
        first_foreign = int(foreign[0]) if foreign.size else -1
    return IdScan(lowest, first_foreign, increasing)
