"""One gRPC call to each of several PS at once, with the retries a restarting PS needs."""

from __future__ import annotations

import logging
from typing import Callable, List, Optional, Sequence, Tuple

import grpc
from elasticdl.worker.grpc_utils import Backoff, is_retryable
from elasticdl.worker.ps_types import PSUnavailableError

logger = logging.getLogger(__name__)

Reissue = Callable[[int, object, grpc.RpcError], Optional[object]]


def fan_out(
    stubs: Sequence[object],
    addrs: Sequence[str],
    method: str,
    requests: Sequence[Tuple[int, object]],
    *,
    retry_timeout: float,
    rpc_timeout: float,
    reissue: Optional[Reissue] = None,
) -> List[object]:
    """Issue `method(req)` on PS `ps_id` for every (ps_id, req) at once; results in order.

    Calls that fail with UNAVAILABLE (a PS restarting) are re-issued until the retry budget
    is spent. Any other error propagates immediately, unless `reissue(ps_id, req, err)`
    returns a replacement request: then that one call (and only that one: the others may
    have been applied) is sent again with it.
    """
    requests = list(requests)
    results: List[object] = [None] * len(requests)
    pending = list(range(len(requests)))
    backoff = Backoff(retry_timeout)
    while pending:
        if len(pending) == 1:
            # One call (one PS): a blocking call skips the future's extra hand-off thread
            # (its cost: benchmarks/runtime/README.md).
            i = pending[0]
            try:
                results[i] = getattr(stubs[requests[i][0]], method)(
                    requests[i][1], timeout=rpc_timeout
                )
                break
            except grpc.RpcError as err:
                if not is_retryable(err):
                    _reissue_or_raise(requests, i, err, reissue)
                    continue
                ps = [requests[i][0]]
                if not backoff.sleep_or_give_up():
                    raise PSUnavailableError(
                        f"PS {addrs[ps[0]]} unreachable for "
                        f"{retry_timeout:.0f}s during {method}: {err.details()}"
                    )
                logger.warning("%s: PS %s unavailable, retrying", method, ps)
                continue
        futures = [
            (
                i,
                getattr(stubs[requests[i][0]], method).future(requests[i][1], timeout=rpc_timeout),
            )
            for i in pending
        ]
        failed, reissued = [], []
        last_err = None
        for i, fut in futures:
            try:
                results[i] = fut.result()
            except grpc.RpcError as err:
                if not is_retryable(err):
                    _reissue_or_raise(requests, i, err, reissue)
                    reissued.append(i)
                    continue
                failed.append(i)
                last_err = err
        if failed:
            ps = sorted({requests[i][0] for i in failed})
            if not backoff.sleep_or_give_up():
                raise PSUnavailableError(
                    f"PS {', '.join(addrs[p] for p in ps)} unreachable for "
                    f"{retry_timeout:.0f}s during {method}: {last_err.details()}"
                )
            logger.warning("%s: PS %s unavailable, retrying", method, ps)
        pending = sorted(failed + reissued)
    return results


def _reissue_or_raise(
    requests: List[Tuple[int, object]], i: int, err: grpc.RpcError, reissue
) -> None:
    """Replace call `i` by what `reissue(ps_id, req, err)` returns; re-raise `err` without one."""
    again = reissue(*requests[i], err) if reissue else None
    if again is None:
        raise err
    requests[i] = (requests[i][0], again)
