"""Parse resource strings such as ``"cpu=0.2,memory=1024Mi,gpu=1"``.

The result is a plain ``{resource name: quantity string}`` dict in Kubernetes naming
(``gpu`` becomes ``nvidia.com/gpu``) that the Kubernetes platform puts into a container's
``resources.requests`` / ``resources.limits``. Plain string parsing, standard library only: the
job spec checks resource flags with it wherever the job runs.

Accepted names: ``cpu``, ``memory``, ``disk``, ``ephemeral-storage``, ``gpu`` (= NVIDIA),
``<vendor domain>/gpu`` (e.g. ``amd.com/gpu``) and ``nvidia.com/<model>`` (e.g.
``nvidia.com/tesla-p100``). GPU counts must be whole numbers (Kubernetes cannot share a GPU).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

NVIDIA_GPU = "nvidia.com/gpu"

_BINARY_SUFFIXES = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_DECIMAL_SUFFIXES = {
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
_CPU = re.compile(r"^(\d+(\.\d*)?|\.\d+)m?$")
_QUANTITY = re.compile(r"^(\d+(\.\d*)?|\.\d+)([eE]\d+|Ki|Mi|Gi|Ti|Pi|Ei|k|K|M|G|T|P|E)?$")
_INTEGER = re.compile(r"^\d+$")
# A DNS subdomain followed by "/gpu": amd.com/gpu, intel.com/gpu, example.org/gpu.
_VENDOR_GPU = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/gpu$")
# nvidia.com/<model>: nvidia.com/tesla-p100, nvidia.com/mig-1g.5gb.
_NVIDIA_MODEL = re.compile(r"^nvidia\.com/[a-zA-Z0-9]([-_.a-zA-Z0-9]*[a-zA-Z0-9])?$")

_PLAIN_NAMES = ("cpu", "memory", "disk", "ephemeral-storage")


class ResourceError(ValueError):
    """A malformed resource string; the message says which part and how to fix it."""


def _canonical_name(name: str) -> str:
    if name in _PLAIN_NAMES:
        return name
    if name == "gpu":
        return NVIDIA_GPU
    if _VENDOR_GPU.match(name) or _NVIDIA_MODEL.match(name):
        return name
    raise ResourceError(
        f"unknown resource {name!r}; use cpu, memory, disk, ephemeral-storage, gpu, "
        "<vendor>/gpu (e.g. amd.com/gpu) or nvidia.com/<model>"
    )


def _is_gpu(name: str) -> bool:
    return name.endswith("/gpu") or name.startswith("nvidia.com/")


def _check_value(name: str, value: str) -> None:
    if _is_gpu(name):
        if not _INTEGER.match(value):
            raise ResourceError(f"{name}={value}: GPUs must be a whole number such as 1 or 2")
        return
    if name == "cpu":
        if not _CPU.match(value):
            raise ResourceError(f"cpu={value}: use cores like 0.5 or 2, or millicores like 250m")
        return
    if not _QUANTITY.match(value):
        raise ResourceError(f"{name}={value}: use a size like 1024Mi, 4Gi or 500M")


def parse_resource(resource: str) -> dict[str, str]:
    """``"cpu=250m, memory=32Mi, gpu=1"`` -> ``{"cpu": "250m", "memory": "32Mi",
    "nvidia.com/gpu": "1"}``. Spaces around items, names and values are ignored; an empty
    string gives ``{}``. Raises :class:`ResourceError` on any bad item."""
    result: dict[str, str] = {}
    if not resource or not resource.strip():
        return result
    for item in resource.split(","):
        item = item.strip()
        if not item:
            raise ResourceError(
                f"empty item in {resource!r}; separate resources with single commas"
            )
        if "=" not in item:
            raise ResourceError(f"{item!r} is not name=value; e.g. cpu=1,memory=4096Mi")
        name, value = (part.strip() for part in item.split("=", 1))
        if not value:
            raise ResourceError(f"{name}= has no value; e.g. {name}=1")
        canonical = _canonical_name(name)
        _check_value(canonical, value)
        if canonical in result:
            raise ResourceError(f"{canonical} is given twice in {resource!r}; keep one")
        result[canonical] = value
    return result


def parse_quantity(value: str) -> Decimal:
    """A Kubernetes quantity as a number: ``"250m"`` -> 0.25, ``"1Gi"`` -> 1073741824."""
    value = value.strip()
    try:
        if value.endswith("m") and _CPU.match(value):
            return Decimal(value[:-1]) / 1000
        for suffixes in (_BINARY_SUFFIXES, _DECIMAL_SUFFIXES):
            for suffix, factor in suffixes.items():
                if value.endswith(suffix):
                    return Decimal(value[: -len(suffix)]) * factor
        return Decimal(value)
    except InvalidOperation:
        raise ResourceError(f"{value!r} is not a quantity like 250m, 0.5, 1024Mi or 4Gi") from None


def check_limit_not_below_request(request: str, limit: str) -> None:
    """Kubernetes rejects a pod whose limit is below its request; say so before submitting."""
    requests, limits = parse_resource(request), parse_resource(limit)
    for name, lim in limits.items():
        if name in requests and parse_quantity(lim) < parse_quantity(requests[name]):
            raise ResourceError(
                f"{name} limit {lim} is below the request {requests[name]}; raise the limit"
            )
