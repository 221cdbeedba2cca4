"""Parse ``--volume`` strings into volume and mount descriptions.

Syntax: volumes separated by ``;``, each a ``,``-separated list of ``key=value``::

    claim_name=c1,mount_path=/data;host_path=/h,mount_path=/q,type=Directory,sub_path=x

Keys: ``claim_name`` (a PersistentVolumeClaim), ``host_path`` (a node directory) or
``secret_name`` (a Secret of the job's namespace, its keys as read-only files readable by the
pods' group, e.g. the job's TLS certificate and key) - exactly one of them; ``mount_path``
(required, absolute); ``sub_path`` and ``read_only`` (optional); ``type`` (host paths only: the
Kubernetes hostPath type). Several entries may mount the same claim, host path or Secret at
different places; they share one volume (Kubernetes rejects two volumes
of one pod with the same source name, and it is what users expect).

Plain string parsing, standard library only: the job spec checks ``--volume`` with it wherever
the job runs; ``elasticdl.k8s.volumes`` turns the result into pod volumes and mounts.
"""

from __future__ import annotations

import dataclasses
import re

_KEYS = ("claim_name", "host_path", "secret_name", "mount_path", "sub_path", "type", "read_only")
_SOURCES = ("claim_name", "host_path", "secret_name")
_SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
HOST_PATH_TYPES = (
    "",
    "DirectoryOrCreate",
    "Directory",
    "FileOrCreate",
    "File",
    "Socket",
    "CharDevice",
    "BlockDevice",
)


class VolumeError(ValueError):
    """A malformed volume string; the message names the entry and the fix."""


@dataclasses.dataclass(frozen=True)
class VolumeSpec:
    """One ``;``-separated entry of ``--volume``."""

    mount_path: str
    claim_name: str = ""
    host_path: str = ""
    type: str = ""
    sub_path: str = ""
    read_only: bool = False
    secret_name: str = ""

    @property
    def source_key(self) -> tuple[str, str]:
        if self.secret_name:
            return ("secret", self.secret_name)
        return ("pvc", self.claim_name) if self.claim_name else ("host", self.host_path)


def _parse_entry(entry: str) -> VolumeSpec:
    fields: dict[str, str] = {}
    for item in entry.split(","):
        item = item.strip()
        if not item:
            raise VolumeError(f"empty item in volume {entry!r}; separate keys with single commas")
        if "=" not in item:
            raise VolumeError(f"{item!r} in volume {entry!r} is not key=value")
        key, value = (part.strip() for part in item.split("=", 1))
        if key not in _KEYS:
            raise VolumeError(
                f"unknown key {key!r} in volume {entry!r}; allowed: {', '.join(_KEYS)}"
            )
        if key in fields:
            raise VolumeError(f"key {key!r} appears twice in volume {entry!r}; keep one")
        if not value:
            raise VolumeError(f"{key}= has no value in volume {entry!r}")
        fields[key] = value
    sources = [k for k in _SOURCES if k in fields]
    if len(sources) > 1:
        raise VolumeError(
            f"volume {entry!r} has both {sources[0]} and {sources[1]}; use one per volume"
        )
    if not sources:
        raise VolumeError(
            f"volume {entry!r} needs claim_name=<pvc> or host_path=<dir> (or secret_name=<secret>)"
        )
    if "secret_name" in fields and not _SECRET_NAME.fullmatch(fields["secret_name"]):
        raise VolumeError(
            f"secret_name {fields['secret_name']!r} in volume {entry!r} is not a Secret name: "
            "use lowercase letters, digits, '-' and '.'"
        )
    if "mount_path" not in fields:
        raise VolumeError(f"volume {entry!r} needs mount_path=<absolute path in the container>")
    if not fields["mount_path"].startswith("/"):
        raise VolumeError(
            f"mount_path {fields['mount_path']!r} in volume {entry!r} must be absolute"
        )
    if "type" in fields:
        if "host_path" not in fields:
            raise VolumeError(f"type= applies to host_path volumes only (volume {entry!r})")
        if fields["type"] not in HOST_PATH_TYPES:
            raise VolumeError(
                f"type {fields['type']!r} in volume {entry!r} is invalid; use one of "
                + ", ".join(t for t in HOST_PATH_TYPES if t)
            )
    read_only = fields.get("read_only", "false").lower()
    if read_only not in ("true", "false"):
        raise VolumeError(f"read_only={fields['read_only']} in volume {entry!r}: use true or false")
    return VolumeSpec(
        mount_path=fields["mount_path"],
        claim_name=fields.get("claim_name", ""),
        host_path=fields.get("host_path", ""),
        type=fields.get("type", ""),
        sub_path=fields.get("sub_path", ""),
        read_only=read_only == "true",
        secret_name=fields.get("secret_name", ""),
    )


def parse_volumes(volume: str) -> list[VolumeSpec]:
    """Parse the whole ``--volume`` value (``""`` -> ``[]``); raises :class:`VolumeError`."""
    specs: list[VolumeSpec] = []
    if not volume or not volume.strip():
        return specs
    seen_mounts: set[str] = set()
    for entry in volume.split(";"):
        entry = entry.strip()
        if not entry:
            continue  # tolerate a trailing ';'
        spec = _parse_entry(entry)
        if spec.mount_path in seen_mounts:
            raise VolumeError(
                f"mount_path {spec.mount_path!r} is used by two volumes; use distinct paths"
            )
        seen_mounts.add(spec.mount_path)
        specs.append(spec)
    return specs
