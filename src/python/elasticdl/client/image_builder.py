"""Build and push images through the Docker Engine API (``zoo build`` / ``zoo push``).

Talks to any engine with the Docker API: dockerd, or podman's compatible service. The engine
is found like the docker CLI finds it: ``DOCKER_HOST`` (+ ``DOCKER_TLS_VERIFY``,
``DOCKER_CERT_PATH``), else ``unix:///var/run/docker.sock``.

Every failure the engine reports -- unreachable socket, missing base image, a bad Dockerfile,
a failing ``RUN``, a rejected push -- becomes one :class:`ImageError` with a one-line message.
The ``docker`` package does not raise for errors inside build/push streams (they arrive as
``error``/``errorDetail`` chunks), so the streams are read here chunk by chunk.

``docker`` is imported inside the functions: the ``elasticdl`` client must start fast and
work for job submission on machines without it.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, TextIO

from elasticdl.client.image_progress import BuildProgress, PushProgress

DEFAULT_ENGINE_URL = "unix:///var/run/docker.sock"
CONNECT_TIMEOUT_S = 20
# Per-read timeout once connected: a RUN step may print nothing for minutes (compiling).
STREAM_TIMEOUT_S = 1800


class ImageError(RuntimeError):
    """The engine could not build or push (exit status 1, one line on stderr)."""


@dataclass(frozen=True)
class BuildResult:
    image: str
    image_id: str
    steps: int
    cached_steps: list[int] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(frozen=True)
class PushResult:
    image: str
    digest: str
    layers_pushed: int
    layers_existing: int
    seconds: float = 0.0


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def _docker():
    try:
        import docker  # noqa: F401  (lazy: heavy, and optional for job submission)
    except ImportError:
        raise ImageError(
            "the 'docker' Python package is not installed: pip install docker"
        ) from None
    return docker


def engine_url(base_url: str | None = None) -> str:
    if base_url:
        return base_url
    import os

    return os.environ.get("DOCKER_HOST") or DEFAULT_ENGINE_URL


def connect(base_url: str | None = None):
    """A ``docker.APIClient`` that has answered a version request (so it is reachable)."""
    docker = _docker()
    kwargs = docker.utils.kwargs_from_env()
    if base_url:
        kwargs["base_url"] = base_url
    url = kwargs.get("base_url") or DEFAULT_ENGINE_URL
    try:
        client = docker.APIClient(version="auto", timeout=CONNECT_TIMEOUT_S, **kwargs)
    except docker.errors.DockerException as e:
        raise ImageError(
            f"cannot reach the container engine at {url} ({_one_line(e)}): start it "
            "(e.g. scripts/container-engine/setup-dockerd.sh) or point DOCKER_HOST at it"
        ) from None
    client.timeout = STREAM_TIMEOUT_S
    return client


def split_image_name(image: str) -> tuple[str, str]:
    """``host:5000/a/b:tag`` -> (``host:5000/a/b``, ``tag``); the tag defaults to latest."""
    if not image or any(c.isspace() for c in image) or "@" in image:
        raise ImageError(
            f"{image!r} is not an image name with an optional tag, e.g. 127.0.0.1:5000/team/model:v1"
        )
    repo, _, tag = image.rpartition(":")
    if not repo or "/" in tag:  # no tag; the colon belonged to a registry port
        return image, "latest"
    return repo, tag


def _stream(chunks: Iterable[dict], on_chunk, what: str) -> None:
    docker = _docker()
    try:
        for chunk in chunks:
            if not isinstance(chunk, dict):
                continue
            if chunk.get("error") or chunk.get("errorDetail"):
                detail = chunk.get("errorDetail") or {}
                raise ImageError(_one_line(chunk.get("error") or detail.get("message") or chunk))
            on_chunk(chunk)
    except docker.errors.APIError as e:
        raise ImageError(_one_line(e.explanation or e)) from None
    except OSError as e:  # requests' errors are OSErrors: the engine went away mid-stream
        raise ImageError(
            f"lost the connection to the container engine during {what}: {_one_line(e)}"
        ) from None


def build_image(
    context: str | Path,
    image: str,
    dockerfile: str = "Dockerfile",
    *,
    buildargs: dict[str, str] | None = None,
    nocache: bool = False,
    base_url: str | None = None,
    out: TextIO | None = None,
) -> BuildResult:
    """Build ``context`` (a directory) into ``image``, streaming progress to ``out``.

    ``rm``/``forcerm`` remove intermediate containers even when a step fails (podman keeps
    them otherwise). No ``pull``: base images that exist only locally (no registry) must work.
    """
    ctx = Path(context)
    if not ctx.is_dir():
        raise ImageError(f"build context {context} is not a directory")
    if not (ctx / dockerfile).is_file():
        raise ImageError(
            f"no {dockerfile} in {context}: create it with 'elasticdl zoo init' (or pass --dockerfile)"
        )
    split_image_name(image)  # validate before sending the context
    client = connect(base_url)
    progress = BuildProgress(out=out or sys.stderr)
    start = time.monotonic()

    def run() -> Iterable[dict]:
        return client.build(
            path=str(ctx),
            dockerfile=dockerfile,
            tag=image,
            rm=True,
            forcerm=True,
            nocache=nocache,
            buildargs=buildargs or None,
            decode=True,
        )

    try:
        _stream(_lazy(run), progress.feed, f"the build of {image}")
    except ImageError as e:
        raise ImageError(f"building {image} failed {progress.where}: {e}") from None
    finally:
        client.close()
    if not progress.image_id:
        raise ImageError(f"building {image}: the engine reported no image id")
    return BuildResult(
        image=image,
        image_id=progress.image_id,
        steps=progress.steps_total,
        cached_steps=list(progress.cached_steps),
        seconds=time.monotonic() - start,
    )


def _lazy(make) -> Iterable[dict]:
    # client.build() sends the request when called: keep that inside _stream's error handling.
    yield from make()


def push_image(image: str, *, base_url: str | None = None, out: TextIO | None = None) -> PushResult:
    """Push ``image`` (``registry/repo[:tag]``) with a progress display; registry credentials
    come from the docker config (``docker login``)."""
    repo, tag = split_image_name(image)
    client = connect(base_url)
    progress = PushProgress(image=f"{repo}:{tag}", out=out or sys.stderr)
    start = time.monotonic()
    try:
        _stream(
            _lazy(lambda: client.push(repo, tag=tag, stream=True, decode=True)),
            progress.feed,
            f"the push of {image}",
        )
    except ImageError as e:
        progress.finish()
        raise ImageError(f"pushing {repo}:{tag} failed: {e}") from None
    finally:
        client.close()
    progress.finish()
    if not progress.digest:
        raise ImageError(f"pushing {repo}:{tag}: the registry confirmed no digest")
    return PushResult(
        image=f"{repo}:{tag}",
        digest=progress.digest,
        layers_pushed=progress.layers_pushed,
        layers_existing=progress.layers_existing,
        seconds=time.monotonic() - start,
    )
