"""Where the job server keeps its state, and its limits (``elasticdl server`` flags).

Layout of ``state_dir`` (everything the server writes, nothing else)::

    tokens.json          user -> sha256 of the user's token (0600)
    server.lock          held (flock) by the one server running on this directory
    packages/<sha256>/   extracted model-zoo packages, keyed by the tarball's sha256
    package-users/<sha256>/<user>  who uploaded each package (only they may use it)
    data/<user>/...      what users uploaded (and what their jobs write: checkpoints, outputs)
    data-sums/<user>/... sha256 of uploaded files, with the size and mtime they describe
    jobs/<user>/<job>/   local job directories (see ``elasticdl.jobs.local_job_dir``)
    builds/<user>/<job>.json  Kubernetes jobs waiting for their image (``image_build_records``)
    images/<tag>         images this server built and pushed (reused by later jobs)
    build-logs/<user>/<job>.log  the last MiBs of a job's image build log (``build_logs``)
    builder/             the build pods' program (mounted into them)
    tmp/                 uploads and extractions in progress; emptied when the server starts

All state is on disk, so a restarted server sees every job and package the last one had.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from elasticdl.server.image_build_records import BuildSettings

MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    state_dir: str
    platform: str = "local"
    host: str = "127.0.0.1"
    port: int = 8080
    tls_cert: str = ""
    tls_key: str = ""
    max_package_bytes: int = 256 * MIB
    # An extracted package may be larger than its gzip tarball, but not without bound.
    max_extracted_bytes: int = 1024 * MIB
    max_package_members: int = 20000
    max_data_bytes: int = 16 * 1024 * MIB
    # --platform=kubernetes: where jobs run, and the volume holding data/ mounted into them.
    namespace: str = "default"
    kube_context: str = ""
    data_volume: str = ""
    image_pull_secrets: str = ""  # what the kubelet pulls job and build images with
    # In-cluster image builds of packages (image_builds.py); off unless all three are given.
    build_base_image: str = ""
    build_repository: str = ""
    state_volume: str = ""
    registry_secret: str = ""
    registry_insecure: bool = False
    build_host_network: bool = False
    max_request_bytes: int = 1 * MIB  # POST /v1/jobs bodies (a spec is a few KiB)
    # Connections (connections.py, request_gate.py): how many, and how long a client may take
    # to send a request's head, and to send the next bytes of its body.
    max_connections: int = 256
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keep_alive_timeout: float = 5.0

    @property
    def builds(self) -> "BuildSettings | None":
        from elasticdl.server.image_build_records import BuildSettings

        if not (self.build_base_image and self.build_repository and self.state_volume):
            return None
        return BuildSettings(
            base_image=self.build_base_image,
            repository=self.build_repository,
            state_volume=self.state_volume,
            registry_secret=self.registry_secret,
            insecure=self.registry_insecure,
            host_network=self.build_host_network,
            image_pull_secrets=self.image_pull_secrets,
        )

    @property
    def root(self) -> Path:
        return Path(self.state_dir).expanduser().absolute()

    @property
    def tokens_file(self) -> Path:
        return self.root / "tokens.json"

    @property
    def packages_dir(self) -> Path:
        return self.root / "packages"

    @property
    def package_users_dir(self) -> Path:
        return self.root / "package-users"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def sums_dir(self) -> Path:
        return self.root / "data-sums"

    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    @property
    def tmp_dir(self) -> Path:
        return self.root / "tmp"

    def make_dirs(self) -> None:
        for path in (
            self.packages_dir,
            self.package_users_dir,
            self.data_dir,
            self.sums_dir,
            self.jobs_dir,
            self.tmp_dir,
        ):
            path.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # tokens, packages and data of every user live below
