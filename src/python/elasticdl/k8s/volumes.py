"""Pod volumes and container mounts from a ``--volume`` value (parsed by
:mod:`elasticdl.common.job_spec.volumes`, whose names are here too).

Results are plain dataclasses whose ``to_dict()`` uses the Kubernetes API field names, so the
Kubernetes platform can build ``V1Volume`` / ``V1VolumeMount`` objects from them without this
module importing the Kubernetes SDK.
"""

from __future__ import annotations

import dataclasses

from elasticdl.common.job_spec.volumes import (  # noqa: F401
    HOST_PATH_TYPES,
    VolumeError,
    VolumeSpec,
    parse_volumes,
)
from elasticdl.k8s.names import volume_name

# Secret files: readable by their owner (root) and the pods' group (fsGroup, k8s.security),
# not by others; never writable.
SECRET_MODE = 0o440


@dataclasses.dataclass(frozen=True)
class Volume:
    name: str
    claim_name: str = ""
    host_path: str = ""
    type: str = ""
    secret_name: str = ""

    def to_dict(self) -> dict:
        if self.secret_name:
            secret = {"secretName": self.secret_name, "defaultMode": SECRET_MODE}
            return {"name": self.name, "secret": secret}
        if self.claim_name:
            return {"name": self.name, "persistentVolumeClaim": {"claimName": self.claim_name}}
        host = {"path": self.host_path}
        if self.type:
            host["type"] = self.type
        return {"name": self.name, "hostPath": host}


@dataclasses.dataclass(frozen=True)
class VolumeMount:
    name: str
    mount_path: str
    sub_path: str = ""
    read_only: bool = False

    def to_dict(self) -> dict:
        mount: dict = {"name": self.name, "mountPath": self.mount_path}
        if self.sub_path:
            mount["subPath"] = self.sub_path
        if self.read_only:
            mount["readOnly"] = True
        return mount


def volumes_and_mounts(volume: str) -> tuple[list[Volume], list[VolumeMount]]:
    """Pod volumes and container mounts for a ``--volume`` value; entries with the same claim
    or host path share one volume (named ``volume-0``, ``volume-1``, ...)."""
    by_source: dict[tuple[str, str], Volume] = {}
    mounts: list[VolumeMount] = []
    for spec in parse_volumes(volume):
        shared = by_source.get(spec.source_key)
        if shared is None:
            shared = Volume(
                name=volume_name(len(by_source)),
                claim_name=spec.claim_name,
                host_path=spec.host_path,
                type=spec.type,
                secret_name=spec.secret_name,
            )
            by_source[spec.source_key] = shared
        elif spec.host_path and spec.type and shared.type != spec.type:
            raise VolumeError(
                f"host_path {spec.host_path!r} is given with two different types; use one"
            )
        mounts.append(
            VolumeMount(
                name=shared.name,
                mount_path=spec.mount_path,
                sub_path=spec.sub_path,
                read_only=spec.read_only,
            )
        )
    return list(by_source.values()), mounts
