"""What the server knows of in-cluster image builds, kept on its state volume: the build
settings (``elasticdl server --build_*``), and one record per package job waiting for its
image, ``<state_dir>/builds/<user>/<job>.json``, beside a marker per image it pushed,
``<state_dir>/images/<tag>`` (reused by later jobs of the same package and base)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from elasticdl.common.job_dir import write_atomically
from elasticdl.common.job_status import JobStatus
from elasticdl.common.types import JobPhase, PlatformName
from elasticdl.k8s.image_build_pod import ImageBuild

BUILDING, FAILED = "building", "failed"


@dataclasses.dataclass(frozen=True)
class BuildSettings:
    """``elasticdl server --build_base_image --build_repository --state_volume ...``."""

    base_image: str  # in the registry of ``repository``; the build pod runs it
    repository: str  # HOST[:PORT]/NAME: where the built images go
    state_volume: str  # claim_name=PVC or host_path=DIR: the volume holding --state_dir
    registry_secret: str = ""  # a Secret with keys username and password (push credentials)
    insecure: bool = False  # plain HTTP to the registry
    host_network: bool = False  # a one-node cluster whose registry is on the node's loopback
    timeout_seconds: int = 1800
    image_pull_secrets: str = ""  # what the kubelet pulls the base image with (comma-separated)

    def image_for(self, package_id: str) -> str:
        """One image per package and base image: the same package on another base is
        another image."""
        base = hashlib.sha256(self.base_image.encode()).hexdigest()[:8]
        return f"{self.repository}:pkg-{package_id[:24]}-{base}"

    def volume_source(self) -> dict[str, Any]:
        key, _, value = self.state_volume.partition("=")
        if key == "claim_name" and value:
            return {"persistentVolumeClaim": {"claimName": value, "readOnly": True}}
        if key == "host_path" and value:
            return {"hostPath": {"path": value, "type": "Directory"}}
        raise ValueError(
            f"--state_volume {self.state_volume!r}: use claim_name=PVC or host_path=DIR "
            "(the volume holding --state_dir)"
        )


@dataclasses.dataclass
class BuildRecord:
    """A package job waiting for its image (or whose build failed)."""

    job_name: str
    owner: str
    command: str
    values: dict[str, Any]  # the spec's values, image_name included
    package: str
    image: str
    phase: str = BUILDING
    message: str = ""
    created_at: float = 0.0

    def status(self, namespace: str) -> JobStatus:
        if self.phase == FAILED:
            phase, message = JobPhase.FAILED, self.message
        else:
            phase = JobPhase.PENDING
            message = self.message or f"building image {self.image}"
        return JobStatus(
            job_name=self.job_name,
            platform=PlatformName.KUBERNETES.value,
            job_type=self.command,
            phase=phase,
            message=message,
            created_at=self.created_at,
            updated_at=time.time(),
            namespace=namespace,
        )

    def build(self, settings: BuildSettings) -> ImageBuild:
        """What the build pod of this record makes."""
        return ImageBuild(
            job_name=self.job_name,
            package=self.package,
            image=self.image,
            base_image=settings.base_image,
            state_volume=settings.volume_source(),
            registry_secret=settings.registry_secret,
            insecure=settings.insecure,
            host_network=settings.host_network,
            timeout_seconds=settings.timeout_seconds,
            image_pull_secrets=settings.image_pull_secrets,
        )


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(data))


class BuildRecords:
    """``<state_dir>/builds/<user>/<job>.json`` and ``<state_dir>/images/<tag>``."""

    def __init__(self, root: Path) -> None:
        self.builds = root / "builds"
        self.images = root / "images"

    def path(self, owner: str, job_name: str) -> Path:
        return self.builds / owner / f"{job_name}.json"

    def save(self, record: BuildRecord) -> None:
        _write_json(self.path(record.owner, record.job_name), dataclasses.asdict(record))

    def get(self, owner: str, job_name: str) -> BuildRecord | None:
        try:
            return BuildRecord(**json.loads(self.path(owner, job_name).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def remove(self, owner: str, job_name: str) -> None:
        self.path(owner, job_name).unlink(missing_ok=True)

    def of(self, owner: str) -> list[BuildRecord]:
        records = (self.get(owner, p.stem) for p in sorted((self.builds / owner).glob("*.json")))
        return [r for r in records if r is not None]

    def all(self) -> list[BuildRecord]:
        if not self.builds.is_dir():
            return []
        return [r for d in sorted(self.builds.iterdir()) if d.is_dir() for r in self.of(d.name)]

    def taken(self, job_name: str) -> bool:
        return any((d / f"{job_name}.json").is_file() for d in self.builds.glob("*"))

    def _marker(self, image: str) -> Path:
        return self.images / image.rpartition(":")[2]

    def pushed(self, image: str) -> bool:
        return self._marker(image).is_file()

    def mark_pushed(self, image: str) -> None:
        _write_json(self._marker(image), {"image": image, "pushed_at": time.time()})
