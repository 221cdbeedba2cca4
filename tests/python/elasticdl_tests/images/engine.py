"""A real container engine for the image tests: Debian's dockerd + a registry on
127.0.0.1:5000 + ``local/base``, started by ``scripts/container-engine/setup-dockerd.sh``.

Several test processes may share the engine (Pants runs test files in parallel), so each user
holds a shared ``flock`` on ``users.lock`` while it runs; whoever leaves last (gets the
exclusive lock) stops the engine. Images, build cache and registry data stay in the engine
directory for the next run.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

REGISTRY = "127.0.0.1:5000"
BASE_IMAGE = "local/base:latest"
SETUP_TIMEOUT_S = 600
STARTED_MARKER = (
    "started-by-tests"  # includes `apt-get install docker.io docker-registry` on a bare machine
)


def repo_root() -> Path:
    """The directory holding scripts/container-engine (the checkout, or Pants' sandbox)."""
    here = Path(__file__).resolve()
    for parent in [Path.cwd(), *here.parents]:
        if (parent / "scripts" / "container-engine" / "setup-dockerd.sh").is_file():
            return parent
    raise FileNotFoundError(
        "scripts/container-engine/setup-dockerd.sh not found above " + str(here)
    )


def engine_dir() -> Path:
    return Path(os.environ.get("ELASTICDL_ENGINE_DIR", "/tmp/elasticdl-engine"))


class EngineUnavailable(RuntimeError):
    pass


@dataclass
class Engine:
    docker_host: str
    registry: str = REGISTRY
    base_image: str = BASE_IMAGE

    def client(self):
        import docker

        return docker.APIClient(base_url=self.docker_host, version="auto", timeout=600)


class EngineLease:
    """Start (or join) the engine; ``release()`` stops it when no other user remains."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self.engine: Engine | None = None

    def acquire(self) -> Engine:
        if os.geteuid() != 0:
            raise EngineUnavailable("the engine setup needs root (dockerd, apt-get)")
        if not shutil.which("apt-get") and not shutil.which("dockerd"):
            raise EngineUnavailable(
                "neither dockerd nor apt-get (to install docker.io) is available"
            )
        root = repo_root()
        d = engine_dir()
        d.mkdir(parents=True, exist_ok=True)
        # Shared lock first, so that a user finishing meanwhile does not stop our engine.
        self._fd = os.open(d / "users.lock", os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_SH)
        r = subprocess.run(
            ["bash", str(root / "scripts" / "container-engine" / "setup-dockerd.sh")],
            capture_output=True,
            text=True,
            timeout=SETUP_TIMEOUT_S,
            env={**os.environ, "ELASTICDL_ENGINE_DIR": str(d)},
        )
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("DOCKER_HOST=")]
        if r.returncode != 0 or not lines:
            self.release(stop=False)
            tail = " | ".join(r.stderr.strip().splitlines()[-3:])
            raise EngineUnavailable(f"setup-dockerd.sh failed (exit {r.returncode}): {tail}")
        if "dockerd started" in r.stderr:
            # We started it, so the tests stop it (an engine a developer started stays up).
            (d / STARTED_MARKER).touch()
        self.engine = Engine(docker_host=lines[-1].split("=", 1)[1])
        return self.engine

    def release(self, stop: bool = True) -> None:
        if self._fd is None:
            return
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        try:
            if stop:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return  # another test process still uses the engine; it stops it
                marker = engine_dir() / STARTED_MARKER
                if not marker.exists():
                    return
                marker.unlink()
                subprocess.run(
                    [
                        "bash",
                        str(repo_root() / "scripts" / "container-engine" / "teardown-dockerd.sh"),
                    ],
                    capture_output=True,
                    timeout=120,
                    env={**os.environ, "ELASTICDL_ENGINE_DIR": str(engine_dir())},
                )
        finally:
            os.close(self._fd)
            self._fd = None
