"""The job server's image (``deploy/docker/build-images.sh server``) in the node's engine, on
the shared CPU base image (base_image.py), built once per server wheel and base image.

It is built under the base image's lock (so that no other test process moves ``elasticdl:cpu``
meanwhile) and recorded in ``<node dir>/server-image.json`` with what it was built from: the
server wheel, ``Dockerfile.server``, ``build-images.sh`` and the base image's id. A rebuild
moves the tag and prunes the old image, which would otherwise keep an old base image alive.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from elasticdl_tests.k8s_node.base_image import _image_id

IMAGE = "elasticdl-server:node-test"
BUILD_TIMEOUT_S = 600


def server_wheel(dist: str) -> Path | None:
    wheels = sorted(Path(dist).glob("elasticdl_server-*.whl"), key=lambda p: p.stat().st_mtime)
    return wheels[-1] if wheels else None


def _inputs_digest(wheel: Path, root: Path, base_id: str) -> str:
    digest = hashlib.sha256(base_id.encode())
    docker = root / "deploy" / "docker"
    for path in (wheel, docker / "Dockerfile.server", docker / "build-images.sh"):
        digest.update(f"{path.name}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def ensure_server_image(node, root: Path, dist: str, base: str, name: str) -> float:
    """Tag the server image ``name`` (e.g. the registry's name for it); the seconds this call
    spent building it (0: reused)."""
    wheel = server_wheel(dist)
    assert wheel is not None, f"no elasticdl_server-*.whl in {dist}"
    marker = node.state_dir / "server-image.json"
    with open(node.state_dir / "base-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        base_id = _image_id(node, base)
        assert base_id, f"the base image {base} is not in the node's engine"
        inputs = _inputs_digest(wheel, root, base_id)
        try:
            recorded = json.loads(marker.read_text())
        except (OSError, ValueError):
            recorded = {}
        current = _image_id(node, IMAGE)
        if current and recorded == {"inputs": inputs, "id": current}:
            node.docker("tag", IMAGE, name)
            return 0.0
        t0 = time.monotonic()
        r = subprocess.run(
            [
                "bash",
                str(root / "deploy" / "docker" / "build-images.sh"),
                "server",
                "--dist",
                dist,
                "--download-deps",
                "--tag",
                IMAGE,
                "--base-image",
                base,
            ],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            env={
                **os.environ,
                "DOCKER_HOST": node.docker_host,
                "PYTHON": shutil.which("python3") or "python3",
            },
        )
        assert r.returncode == 0, r.stderr[-5000:]
        seconds = time.monotonic() - t0
        marker.write_text(json.dumps({"inputs": inputs, "id": _image_id(node, IMAGE)}))
        node.docker("tag", IMAGE, name)  # the previous image is untagged now: pruned
        node.docker("image", "prune", "-f", check=False)
        return seconds
