"""The model-zoo image of a job submitted with ``--image_base`` (its build form)::

    elasticdl train --image_base=elasticdl:cpu --docker_image_prefix=reg.example.com/team/ \\
        --model_zoo=./model_zoo --model_def=... --cluster_spec=spec.py ...

At submit time the client builds the image ``zoo build`` would build from ``zoo init``'s
Dockerfile (:mod:`elasticdl.client.zoo_dockerfile`: the zoo at ``/model_zoo``, the cluster spec
at ``/cluster_spec/``) on ``--image_base``, in the engine of ``DOCKER_HOST``, with the same
progress display, and pushes it to ``<prefix>elasticdl:<tag>``. The tag is a digest of what
goes into the image (the base image's id and every file of the build context), so submitting
the same zoo again reuses the image (no build) and its push uploads nothing. Without
``--docker_image_prefix`` the image ``elasticdl:<tag>`` is built and not pushed: a one-node
cluster whose kubelet uses this engine runs it from there.

The job then runs with ``--image_name`` set to that image and ``--model_zoo=/model_zoo``.
Engine failures raise :class:`ImageBuildFailed` (an ``OSError``: exit status 1, one line).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, TextIO

from elasticdl.client.zoo_dockerfile import (
    DOCKERIGNORE,
    MODEL_ZOO_DIR,
    ZooInitConfig,
    init_model_zoo,
)
from elasticdl.common.job_spec import JobSpec, image_in_prefix

IMAGE_REPOSITORY = "elasticdl"  # the original's name: <prefix>elasticdl:<tag>
TAG_LENGTH = 16
_ZOO_IN_CONTEXT = "model_zoo"
# What the generated .dockerignore keeps out of the image stays out of the tag's digest too.
_IGNORED = shutil.ignore_patterns(
    *[
        line.strip().removeprefix("**/")
        for line in DOCKERIGNORE.splitlines()
        if line.strip() and not line.startswith("#")
    ]
)


class ImageBuildFailed(OSError):
    """The engine could not build or push the job's image (exit status 1)."""


@dataclass(frozen=True)
class ZooImageRequest:
    """What the job's image is made of and where it goes."""

    base_image: str
    model_zoo: str  # a local directory
    prefix: str = ""  # "" = build only
    cluster_spec: str = ""  # a local file, copied to /cluster_spec/
    extra_pypi_index: str = ""

    @classmethod
    def from_spec(cls, spec: JobSpec) -> "ZooImageRequest":
        return cls(
            base_image=spec.image_base,
            model_zoo=os.path.expanduser(spec.model_zoo or "."),
            prefix=spec.docker_image_prefix,
            cluster_spec=os.path.expanduser(spec.cluster_spec) if spec.cluster_spec else "",
            # The spec's default index (pypi.org) is what pip uses anyway: no extra line.
            extra_pypi_index=""
            if spec.extra_pypi_index == JobSpec.extra_pypi_index
            else spec.extra_pypi_index,
        )


@dataclass(frozen=True)
class ZooImage:
    image: str
    built: bool  # False: the engine already had this image (same content)
    pushed: bool
    layers_uploaded: int = 0


def image_name(prefix: str, tag: str) -> str:
    return image_in_prefix(prefix, f"{IMAGE_REPOSITORY}:{tag}")


def write_context(request: ZooImageRequest, directory: Path) -> None:
    """The build context: the zoo under ``model_zoo/``, the cluster spec, ``zoo init``'s
    Dockerfile and .dockerignore."""
    shutil.copytree(request.model_zoo, directory / _ZOO_IN_CONTEXT, ignore=_IGNORED)
    cluster_spec = ""
    if request.cluster_spec:
        cluster_spec = Path(request.cluster_spec).name
        shutil.copyfile(request.cluster_spec, directory / cluster_spec)
    config = ZooInitConfig(
        base_image=request.base_image,
        model_zoo=_ZOO_IN_CONTEXT,
        cluster_spec=cluster_spec,
        extra_pypi_index=request.extra_pypi_index,
    )
    init_model_zoo(config, directory)


def _files(directory: Path) -> Iterator[Path]:
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            yield Path(root) / name


def content_tag(directory: Path, base_image_id: str) -> str:
    """A digest of the base image's id and every file (path, executable bit, bytes) of the
    build context: equal contexts on equal bases give equal tags."""
    digest = hashlib.sha256(f"base {base_image_id}\n".encode())
    for path in _files(directory):
        rel = path.relative_to(directory).as_posix()
        executable = os.access(path, os.X_OK)
        digest.update(f"file {rel} {int(executable)} {path.stat().st_size}\n".encode())
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:TAG_LENGTH]


def _base_image_id(client, base: str, out: TextIO) -> str:
    """The base image's id; pulled first when the engine does not have it."""
    from elasticdl.client.image_builder import ImageError, _docker, split_image_name

    docker = _docker()
    try:
        return client.inspect_image(base)["Id"]
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.APIError as e:
        raise ImageError(f"--image_base {base}: {e.explanation or e}") from None
    repo, tag = split_image_name(base)
    out.write(f"elasticdl: pulling --image_base {base} (not in the engine)\n")
    try:
        for chunk in client.pull(repo, tag=tag, stream=True, decode=True):
            if isinstance(chunk, dict) and chunk.get("error"):
                raise ImageError(f"--image_base {base}: pulling it failed: {chunk['error']}")
        return client.inspect_image(base)["Id"]
    except docker.errors.APIError as e:
        raise ImageError(
            f"--image_base {base} is not in the engine and pulling it failed "
            f"({e.explanation or e}); build it (deploy/docker/build-images.sh) or check the name"
        ) from None


def _has_image(client, image: str) -> bool:
    from elasticdl.client.image_builder import _docker

    docker = _docker()
    try:
        client.inspect_image(image)
        return True
    except docker.errors.ImageNotFound:
        return False


def build_zoo_image(
    request: ZooImageRequest, *, base_url: str | None = None, out: TextIO | None = None
) -> ZooImage:
    """Build (unless the engine has it) and push (with a prefix) the job's image."""
    from elasticdl.client.image_builder import ImageError, build_image, connect, push_image

    out = out or sys.stderr
    try:
        with tempfile.TemporaryDirectory(prefix="elasticdl-zoo-") as tmp:
            context = Path(tmp)
            write_context(request, context)
            client = connect(base_url)
            try:
                base_id = _base_image_id(client, request.base_image, out)
                image = image_name(request.prefix, content_tag(context, base_id))
                built = not _has_image(client, image)
            finally:
                client.close()
            if built:
                result = build_image(context, image, base_url=base_url, out=out)
                out.write(
                    f"elasticdl: built {image} on {request.base_image} in "
                    f"{result.seconds:.1f}s, {len(result.cached_steps)}/{result.steps} steps "
                    "cached\n"
                )
            else:
                out.write(f"elasticdl: {image} is up to date (same zoo, same base image)\n")
        if not request.prefix:
            return ZooImage(image=image, built=built, pushed=False)
        pushed = push_image(image, base_url=base_url, out=out)
        out.write(
            f"elasticdl: pushed {image} in {pushed.seconds:.1f}s ({pushed.layers_pushed} "
            f"layers uploaded, {pushed.layers_existing} already there)\n"
        )
        out.flush()
        return ZooImage(image=image, built=built, pushed=True, layers_uploaded=pushed.layers_pushed)
    except ImageError as e:
        raise ImageBuildFailed(str(e)) from None


def spec_with_image(spec: JobSpec, image: ZooImage) -> tuple[JobSpec, list[str]]:
    """The spec the job runs with: the built image, the zoo where the image holds it."""
    notices = []
    changes = dict(
        image_name=image.image, image_base="", docker_image_prefix="", model_zoo=MODEL_ZOO_DIR
    )
    if not image.pushed and spec.image_pull_policy == "Always":
        # An unpushed image exists only in this engine: pulling it would fail.
        changes["image_pull_policy"] = "IfNotPresent"
        notices.append(
            "image_pull_policy: IfNotPresent (the image was not pushed: no "
            "--docker_image_prefix; the node runs it from its engine)"
        )
    return spec.replace(**changes), notices


def prepare(
    spec: JobSpec, *, base_url: str | None = None, out: TextIO | None = None
) -> tuple[JobSpec, list[str]]:
    """For a resolved spec with ``--image_base`` (the build form): build and push its image
    and return the spec that runs it. Other specs are returned unchanged."""
    if not spec.image_base:
        return spec, []
    image = build_zoo_image(ZooImageRequest.from_spec(spec), base_url=base_url, out=out)
    return spec_with_image(spec, image)
