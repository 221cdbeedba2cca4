"""The largest request this PS accepts, sized from the model it holds (see
elasticdl.common.message_caps for the rule and why)."""
from __future__ import annotations

from elasticdl.common import message_caps
from elasticdl.ps.parameters import Parameters


class RequestCap:
    """Callable: (cap in bytes, where it comes from). Recomputed when the model's set of
    parameters or tables changes; shapes never change once a parameter exists."""

    def __init__(self, params: Parameters, minibatch_size: int):
        self._params = params
        self._minibatch_size = int(minibatch_size)
        self._key = None
        self._value = (message_caps.TRANSPORT_MAX_BYTES, "no model pushed yet")

    def __call__(self) -> tuple[int, str]:
        params = self._params
        key = (len(params.dense), len(params.embedding_tables))
        if key == self._key or key == (0, 0):
            return self._value
        try:
            dense = sum(int(v.nbytes) for v in list(params.dense.values()))
            dims = [t.dim for t in list(params.embedding_tables.values())]
        except RuntimeError:  # the model is being pushed right now: keep the last answer
            return self._value
        cap = message_caps.ps_cap(dense, dims, self._minibatch_size)
        why = (
            f"sized from this PS's {dense} dense bytes and {len(dims)} embedding table(s) at "
            f"--minibatch_size={self._minibatch_size}"
        )
        self._key, self._value = key, (cap, why)
        return self._value
