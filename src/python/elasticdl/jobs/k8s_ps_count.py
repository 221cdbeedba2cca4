"""``elasticdl scale-ps`` on Kubernetes: the client has no route to the master's gRPC port, so
it writes the request on the master pod (an annotation, through the Kubernetes API: the user
needs ``patch`` on pods) and waits for the master's outcome beside it
(:mod:`elasticdl.common.ps_count_request`, :mod:`elasticdl.master.ps_count_requests`)."""

from __future__ import annotations

import time
import uuid
from typing import Callable

from elasticdl.common.ps_count_request import (
    ACCEPTED,
    REQUEST_ANNOTATION,
    PSCountOutcome,
    PSCountRequest,
)
from elasticdl.jobs.errors import ClientError
from elasticdl.k8s.client import K8sApiError, K8sClient

DEFAULT_TIMEOUT_S = 60.0
POLL_S = 0.5


def request_ps_count(
    k8s: K8sClient,
    master_pod: str,
    name: str,
    num_ps: int,
    timeout: float = DEFAULT_TIMEOUT_S,
    request_id: str | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Ask job ``name``'s master (pod ``master_pod``) to run ``num_ps`` PS; returns its
    one-line answer. Raises ``ClientError`` (one line naming the fix) when it refuses, when the
    request cannot be written, or when no answer comes in ``timeout`` seconds."""
    request = PSCountRequest(request_id or uuid.uuid4().hex[:12], num_ps)
    try:
        written = k8s.annotate_pod(master_pod, {REQUEST_ANNOTATION: request.encode()})
    except K8sApiError as e:
        hint = (
            f"; your user needs 'patch' on pods in namespace {k8s.namespace}"
            if e.status == 403
            else ""
        )
        raise ClientError(
            f"cannot write the PS count request on pod {master_pod}: {e}{hint}"
        ) from None
    if not written:
        raise ClientError(
            f"job {name}'s master pod {master_pod} is gone; see 'elasticdl status {name}'"
        )
    deadline = clock() + timeout
    while True:
        outcome = _outcome(k8s, master_pod, name)
        if outcome is not None and outcome.id == request.id and outcome.answered:
            if outcome.state == ACCEPTED:
                return outcome.message
            raise ClientError(outcome.message)
        if clock() >= deadline:
            raise ClientError(
                f"job {name}'s master did not answer the PS count request in {timeout:g} s; "
                f"see 'elasticdl logs {name}' and 'elasticdl status {name}', or wait longer "
                "with --timeout (a master of a version without scale-ps on Kubernetes never "
                "answers)"
            )
        sleep(POLL_S)


def _outcome(k8s: K8sClient, master_pod: str, name: str) -> PSCountOutcome | None:
    try:
        pod = k8s.get_pod(master_pod)
    except K8sApiError as e:
        raise ClientError(f"cannot read pod {master_pod}: {e}") from None
    if pod is None:
        raise ClientError(
            f"job {name}'s master pod {master_pod} went away before answering; see "
            f"'elasticdl status {name}'"
        )
    return PSCountOutcome.of(pod.metadata.annotations)
