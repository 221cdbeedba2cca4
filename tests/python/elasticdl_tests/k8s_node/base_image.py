"""The real CPU base image (``deploy/docker/build-images.sh cpu``) in the node's engine, built
once for every real-node test file.

Pants runs each test file in its own process, so a session fixture alone would build it once
per file (minutes each). The build runs under an exclusive ``flock`` on
``<node dir>/base-image.lock`` and records what it was built from (a digest of the wheels and
of ``deploy/docker``) beside the image id in ``<node dir>/base-image.json``; a later process
whose wheels are the same finds the image there and uses it. A rebuild moves the tag and the
old image is pruned, so the engine holds one base image (~2.5 GB) at a time.
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

IMAGE = "elasticdl:cpu"
BUILD_TIMEOUT_S = 1500  # a cold wheel cache downloads ~530 MB first


def wheel_dir(root: Path) -> str | None:
    """Where the Pants wheels are: $ELASTICDL_WHEEL_DIR, else dist/ of the checkout(s)."""
    checkouts = [root] + [Path(p) for p in [os.environ.get("ELASTICDL_SOURCE_ROOT", "")] if p]
    for d in [os.environ.get("ELASTICDL_WHEEL_DIR", "")] + [str(c / "dist") for c in checkouts]:
        if d and list(Path(d).glob("elasticdl-[0-9]*.whl")):
            return d
    return None


def node_script(node, root: Path, *args: str, timeout: float = 600) -> str:
    """The last line ``scripts/k8s/start-node.sh ARGS`` prints."""
    r = subprocess.run(
        ["bash", str(root / "scripts" / "k8s" / "start-node.sh"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "ELASTICDL_NODE_DIR": str(node.state_dir)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1]


def _inputs_digest(dist: str, root: Path) -> str:
    digest = hashlib.sha256()
    docker = root / "deploy" / "docker"
    # What the build reads; the same in a checkout and in Pants' sandbox (which lacks BUILD).
    # The server's wheel is not in the base image (build-images.sh leaves it to KIND server).
    wheels = [w for w in Path(dist).glob("*.whl") if not w.name.startswith("elasticdl_server-")]
    files = sorted(wheels) + [
        docker / "Dockerfile.cpu",
        docker / "build-images.sh",
    ]
    for path in files:
        digest.update(f"{path.name}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _image_id(node, image: str) -> str:
    return node.docker("image", "inspect", "--format", "{{.Id}}", image, check=False).strip()


def ensure_base_image(node, root: Path, dist: str) -> tuple[str, float]:
    """The base image's name and the seconds this call spent building it (0: reused)."""
    marker = node.state_dir / "base-image.json"
    with open(node.state_dir / "base-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a parallel test file waits for this build
        inputs = _inputs_digest(dist, root)
        try:
            recorded = json.loads(marker.read_text())
        except (OSError, ValueError):
            recorded = {}
        current = _image_id(node, IMAGE)
        if current and recorded == {"inputs": inputs, "id": current}:
            return IMAGE, 0.0
        os_base = node_script(node, root, "base-image")  # Debian + python3, host packages
        t0 = time.monotonic()
        r = subprocess.run(
            [
                "bash",
                str(root / "deploy" / "docker" / "build-images.sh"),
                "cpu",
                "--dist",
                dist,
                "--download-deps",
                "--tag",
                IMAGE,
                "--base-image",
                os_base,
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
        # The image an earlier build tagged, if any, is untagged now: ~2.5 GB freed.
        node.docker("image", "prune", "-f", check=False)
        return IMAGE, seconds
