"""Loads the native extension once and decides which backend serves CPU arrays.

``ELASTICDL_OPS_BACKEND=reference`` forces the NumPy reference (for debugging or to
compare); otherwise the native module ``elasticdl_native`` is used when importable.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

# Bumped whenever the native function signatures change, so a stale build is ignored
# (with a warning) instead of being called with the wrong arguments.
NATIVE_ABI = 7

native = None
_reason = ""

if os.environ.get("ELASTICDL_OPS_BACKEND", "").lower() == "reference":
    _reason = "ELASTICDL_OPS_BACKEND=reference"
else:
    try:
        import elasticdl_native as _mod

        if getattr(_mod, "ABI_VERSION", None) != NATIVE_ABI:
            _reason = f"elasticdl_native ABI {getattr(_mod, 'ABI_VERSION', None)} != {NATIVE_ABI} (stale build)"
        else:
            native = _mod
    except ImportError as e:
        _reason = f"elasticdl_native not importable ({e})"

if native is not None:
    logger.info(
        "elasticdl.ops backend: native (%d OpenMP threads, CUDA %s)",
        native.num_threads(),
        "built" if native.has_cuda() else "not built",
    )
else:
    logger.info("elasticdl.ops backend: reference NumPy (%s)", _reason)


def name() -> str:
    return "native" if native is not None else "reference"


def cuda_built() -> bool:
    return native is not None and bool(native.has_cuda())
