"""Whether any node could ever run a replica: its request against each node's allocatable.

The client warns before submitting when no schedulable node's allocatable (what the kubelet
offers pods, capacity minus its reservations) holds a replica's request: that replica would
stay Pending forever whatever else runs. It is a warning, not an error: nodes may be added
(a cluster autoscaler). What other pods use is not subtracted (that changes; the replica
waits for it), taints and node selectors are not considered.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Iterable

from elasticdl.k8s.resources import parse_quantity, parse_resource

if TYPE_CHECKING:
    from elasticdl.common.job_spec import JobSpec


def replica_requests(job: "JobSpec") -> dict[str, str]:
    """Replica kind -> its resource request string (the kinds the job launches)."""
    requests = {"master": job.master_resource_request, "worker": job.worker_resource_request}
    if job.num_ps_pods:
        requests["ps"] = job.ps_resource_request
    return {kind: request for kind, request in requests.items() if request}


def _fits(request: dict[str, Decimal], allocatable: dict[str, str]) -> bool:
    for name, amount in request.items():
        offered = allocatable.get(name)
        if amount > 0 and (offered is None or parse_quantity(str(offered)) < amount):
            return False
    return True


def unfit_warnings(requests: dict[str, str], nodes: Iterable) -> list[str]:
    """One line per replica kind whose request no schedulable node's allocatable holds.
    ``nodes``: ``V1Node`` objects (or anything with ``spec.unschedulable`` and
    ``status.allocatable``); no node that reports its allocatable says nothing (nothing to
    compare with)."""
    offers = [
        dict(node.status.allocatable)
        for node in nodes
        if not (node.spec and node.spec.unschedulable) and node.status and node.status.allocatable
    ]
    if not offers:
        return []
    warnings = []
    for kind, request_text in requests.items():
        request = {k: parse_quantity(str(v)) for k, v in parse_resource(request_text).items()}
        if any(_fits(request, offer) for offer in offers):
            continue
        largest = {
            name: max((parse_quantity(str(o.get(name, "0"))) for o in offers), default=Decimal(0))
            for name in request
        }
        offered = ", ".join(f"{name} {_fmt(largest[name])}" for name in request)
        warnings.append(
            f"warning: no node's allocatable holds a {kind}'s request ({request_text}; the most "
            f"any node offers: {offered}): it would stay Pending; lower "
            f"--{kind}_resource_request or add a larger node"
        )
    return warnings


def _fmt(value: Decimal) -> str:
    if value >= 2**30 and value % 2**20 == 0:
        return f"{value / 2**30:.3g}Gi"
    return f"{value.normalize():f}"
