"""A model-zoo image without a container engine: the base image + ONE new layer, pushed with
the OCI distribution HTTP API.

What ``elasticdl zoo build`` makes with a Dockerfile (``elasticdl.client.zoo_dockerfile``) is,
for running a job: the base image, the model zoo's ``requirements.txt`` pip-installed into
``/usr/local``, the model zoo at ``/model_zoo`` and ``PYTHONPATH=/model_zoo``. This module
makes the same image from inside a pod that RUNS the base image, as its non-root user, with no
engine, no docker socket and no privileges (the job server's build pods, ``deploy/k8s``):

``install``
    ``pip install --root STAGE -r <package>/requirements.txt``: what is not yet in the base
    image lands under ``STAGE/usr/local/...``, exactly where the Dockerfile's ``RUN pip
    install`` (as root) would have put it. This step runs the user's requirements (an sdist's
    build runs code): the build pod runs it in a container without registry credentials.
``push``
    One layer (gzip tar): ``STAGE``'s tree + the package at ``/model_zoo``, owned by root as
    ``COPY`` and ``RUN`` as root leave them. Then the base's layers (mounted from the base's
    repository, or copied when the registry cannot mount), that layer, a config with the
    layer's diff id and ``PYTHONPATH=/model_zoo`` added (user, workdir, entrypoint as the
    base's), and the manifest under the target tag.

Registry credentials: ``ELASTICDL_REGISTRY_USERNAME`` / ``ELASTICDL_REGISTRY_PASSWORD`` (basic,
or exchanged for a bearer token where the registry asks for one). Plain HTTP only with
``--insecure`` (a registry on loopback or inside the cluster without TLS).

Standard library only: the job server copies this file into the build pods, whatever version
of ElasticDL their base image carries. ``python3 oci_build.py install|push ...``.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import datetime
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, BinaryIO

MODEL_ZOO_DIR = "model_zoo"  # /model_zoo in the image, as zoo_dockerfile.MODEL_ZOO_DIR
PYTHONPATH = "/model_zoo"
REQUIREMENTS = "requirements.txt"
USERNAME_ENV = "ELASTICDL_REGISTRY_USERNAME"
PASSWORD_ENV = "ELASTICDL_REGISTRY_PASSWORD"
# Files the zoo image's .dockerignore keeps out (zoo_dockerfile.DOCKERIGNORE).
SKIPPED = re.compile(
    r"(^|/)(__pycache__|\.git|\.env(\..*)?|\.pytest_cache|\.mypy_cache)$|\.py[cod]$"
)

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
ACCEPT = ", ".join((DOCKER_MANIFEST, OCI_MANIFEST, DOCKER_LIST, OCI_INDEX))
CHUNK = 1 << 20


class BuildError(RuntimeError):
    """One line for the build's log (the job's status shows its last lines)."""


@dataclasses.dataclass(frozen=True)
class ImageRef:
    """``host[:port]/repo/name:tag`` (a registry host is required: images are pushed)."""

    registry: str
    repository: str
    tag: str

    @classmethod
    def parse(cls, ref: str) -> "ImageRef":
        host, _, rest = ref.partition("/")
        if not rest or not ("." in host or ":" in host or host == "localhost"):
            raise BuildError(f"image {ref!r} names no registry; use HOST[:PORT]/NAME:TAG")
        name, sep, tag = rest.rpartition(":")
        if not sep or "/" in tag:
            name, tag = rest, "latest"
        if "@" in rest or not re.fullmatch(r"[a-z0-9]+([._/-][a-z0-9]+)*", name):
            raise BuildError(f"image {ref!r}: {name!r} is not a repository name")
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag):
            raise BuildError(f"image {ref!r}: {tag!r} is not a tag")
        return cls(host, name, tag)

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}:{self.tag}"


@dataclasses.dataclass(frozen=True)
class Credentials:
    username: str = ""
    password: str = ""

    @classmethod
    def from_env(cls) -> "Credentials":
        return cls(os.environ.get(USERNAME_ENV, ""), os.environ.get(PASSWORD_ENV, ""))


class Registry:
    """The registry's HTTP API for one host, with basic or bearer auth on demand."""

    def __init__(self, host: str, creds: Credentials, insecure: bool = False) -> None:
        self.base = f"{'http' if insecure else 'https'}://{host}"
        self.creds = creds
        self._auth = ""  # the Authorization header once a challenge was answered
        self.scopes: list[str] = []

    def request(
        self,
        method: str,
        path: str,
        body: bytes | BinaryIO | None = None,
        headers: dict[str, str] | None = None,
        ok: tuple[int, ...] = (200,),
    ):
        url = path if path.startswith("http") else self.base + path
        for attempt in (0, 1):
            req = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
            if self._auth:
                req.add_header("Authorization", self._auth)
            try:
                resp = _OPENER.open(req, timeout=300)
            except urllib.error.HTTPError as e:
                if e.code == 401 and attempt == 0 and not hasattr(body, "read"):
                    self._answer(e.headers.get("WWW-Authenticate", ""))
                    continue
                if e.code in ok:
                    return e
                detail = e.read(300).decode("utf-8", "replace").strip().replace("\n", " ")
                raise BuildError(f"{method} {url}: HTTP {e.code} {detail}") from None
            except urllib.error.URLError as e:
                raise BuildError(f"{method} {url}: {e.reason}") from None
            if resp.status not in ok:
                raise BuildError(f"{method} {url}: unexpected HTTP {resp.status}")
            return resp
        raise AssertionError("unreachable")

    def _answer(self, challenge: str) -> None:
        scheme, _, params = challenge.partition(" ")
        if not self.creds.username:
            raise BuildError(
                f"the registry {self.base} asks for credentials; give the registry Secret "
                f"({USERNAME_ENV}/{PASSWORD_ENV})"
            )
        basic = base64.b64encode(f"{self.creds.username}:{self.creds.password}".encode()).decode()
        if scheme.lower() == "basic":
            self._auth = f"Basic {basic}"
            return
        if scheme.lower() != "bearer":
            raise BuildError(
                f"the registry {self.base} asks for {scheme!r} auth; use basic or bearer"
            )
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        query = [("service", fields.get("service", ""))]
        for scope in self.scopes or [fields.get("scope", "")]:
            query.append(("scope", scope))
        url = fields.get("realm", "") + "?" + urllib.parse.urlencode([q for q in query if q[1]])
        req = urllib.request.Request(url, headers={"Authorization": f"Basic {basic}"})
        try:
            with _OPENER.open(req, timeout=60) as resp:
                answer = json.load(resp)
        except (urllib.error.URLError, ValueError) as e:
            raise BuildError(f"the registry's token service {fields.get('realm')}: {e}") from None
        self._auth = f"Bearer {answer.get('token') or answer.get('access_token', '')}"

    # ---- manifests and blobs -------------------------------------------------------------
    def manifest(self, repo: str, reference: str) -> tuple[str, dict]:
        resp = self.request("GET", f"/v2/{repo}/manifests/{reference}", headers={"Accept": ACCEPT})
        with resp:
            media_type = resp.headers.get("Content-Type", "").split(";")[0]
            data = json.load(resp)
        return data.get("mediaType") or media_type, data

    def has_manifest(self, repo: str, reference: str) -> bool:
        resp = self.request(
            "HEAD", f"/v2/{repo}/manifests/{reference}", headers={"Accept": ACCEPT}, ok=(200, 404)
        )
        resp.close()
        return resp.status == 200

    def blob(self, repo: str, digest: str) -> bytes:
        with self.request("GET", f"/v2/{repo}/blobs/{digest}") as resp:
            return resp.read()

    def has_blob(self, repo: str, digest: str) -> bool:
        resp = self.request("HEAD", f"/v2/{repo}/blobs/{digest}", ok=(200, 404))
        resp.close()
        return resp.status == 200

    def mount(self, repo: str, digest: str, source: str) -> bool:
        """Cross-repository mount; False when the registry started an upload instead."""
        query = urllib.parse.urlencode({"mount": digest, "from": source})
        resp = self.request("POST", f"/v2/{repo}/blobs/uploads/?{query}", ok=(201, 202))
        resp.close()
        if resp.status == 202:  # an upload session nobody needs; it expires on its own
            return False
        return True

    def upload(self, repo: str, digest: str, body: bytes | BinaryIO, size: int) -> None:
        """Monolithic upload (POST a session, PUT the whole blob)."""
        resp = self.request("POST", f"/v2/{repo}/blobs/uploads/", ok=(202,))
        resp.close()
        location = urllib.parse.urljoin(self.base + "/", resp.headers["Location"])
        sep = "&" if "?" in location else "?"
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        self.request(
            "PUT", f"{location}{sep}digest={digest}", body=body, headers=headers, ok=(201,)
        ).close()

    def put_manifest(self, repo: str, tag: str, media_type: str, manifest: bytes) -> None:
        self.request(
            "PUT",
            f"/v2/{repo}/manifests/{tag}",
            body=manifest,
            headers={"Content-Type": media_type},
            ok=(201,),
        ).close()


_OPENER = urllib.request.build_opener(urllib.request.HTTPRedirectHandler)


# ---- the new layer ---------------------------------------------------------------------------
def _add_tree(tar: tarfile.TarFile, root: Path, prefix: str, mtime: int) -> None:
    """``root``'s files under ``prefix`` in the layer, owned by root:root (as COPY and RUN as
    root leave them), readable by all (executable by all where the owner could run it), links
    kept as links."""
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if SKIPPED.search(rel):
            continue
        info = tar.gettarinfo(str(path), arcname=f"{prefix}/{rel}" if prefix else rel)
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = mtime
        executable = info.isdir() or info.mode & 0o111
        info.mode = (info.mode | 0o644 | (0o111 if executable else 0)) & 0o755
        if info.isfile():
            with open(path, "rb") as f:
                tar.addfile(info, f)
        elif info.isdir() or info.issym():
            tar.addfile(info)


@dataclasses.dataclass(frozen=True)
class Layer:
    path: Path  # the gzip tarball
    digest: str  # of the gzip bytes (the blob)
    diff_id: str  # of the uncompressed tar (the config's rootfs)
    size: int


def make_layer(package: Path, stage: Path | None, out_dir: Path) -> Layer:
    """The one layer: ``stage``'s tree at ``/`` and ``package`` at ``/model_zoo``. Same
    inputs, same bytes (fixed mtimes), so a rebuilt package gives the same digest."""
    raw = out_dir / "layer.tar"
    with tarfile.open(raw, "w", format=tarfile.PAX_FORMAT) as tar:
        if stage is not None and stage.is_dir():
            _add_tree(tar, stage, "", 0)
        top = tarfile.TarInfo(MODEL_ZOO_DIR)
        top.type, top.mode, top.mtime = tarfile.DIRTYPE, 0o755, 0
        tar.addfile(top)
        _add_tree(tar, package, MODEL_ZOO_DIR, 0)
    diff = hashlib.sha256()
    packed = out_dir / "layer.tar.gz"
    with open(raw, "rb") as src, open(packed, "wb") as dst:
        with gzip.GzipFile(fileobj=dst, mode="wb", mtime=0) as gz:
            while chunk := src.read(CHUNK):
                diff.update(chunk)
                gz.write(chunk)
    raw.unlink()
    digest = hashlib.sha256()
    with open(packed, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return Layer(
        packed, f"sha256:{digest.hexdigest()}", f"sha256:{diff.hexdigest()}", packed.stat().st_size
    )


def image_config(base: dict[str, Any], layer: Layer) -> dict[str, Any]:
    """The base's config with the layer added and ``PYTHONPATH=/model_zoo`` (``zoo build``'s
    ``ENV PYTHONPATH=/model_zoo``); everything else (user, workdir, cmd) as the base's."""
    config = json.loads(json.dumps(base))
    inner = config.setdefault("config", {})
    env = [e for e in inner.get("Env") or [] if not e.startswith("PYTHONPATH=")]
    inner["Env"] = env + [f"PYTHONPATH={PYTHONPATH}"]
    config.setdefault("rootfs", {"type": "layers", "diff_ids": []})["diff_ids"].append(
        layer.diff_id
    )
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    config["created"] = now
    config.setdefault("history", []).append(
        {"created": now, "created_by": "elasticdl image build: requirements.txt + /model_zoo"}
    )
    return config


def _platform_manifest(registry: Registry, ref: ImageRef) -> tuple[str, dict]:
    media_type, manifest = registry.manifest(ref.repository, ref.tag)
    if media_type in (DOCKER_LIST, OCI_INDEX):
        machine = {"x86_64": "amd64", "aarch64": "arm64"}.get(
            os.uname().machine, os.uname().machine
        )
        for entry in manifest.get("manifests", []):
            platform = entry.get("platform", {})
            if platform.get("os") == "linux" and platform.get("architecture") == machine:
                return registry.manifest(ref.repository, entry["digest"])
        raise BuildError(f"base image {ref} has no linux/{machine} image")
    if media_type not in (DOCKER_MANIFEST, OCI_MANIFEST):
        raise BuildError(f"base image {ref}: manifest type {media_type!r} is not supported")
    return media_type, manifest


def push_image(
    package: Path,
    stage: Path | None,
    base: ImageRef,
    target: ImageRef,
    creds: Credentials,
    insecure: bool = False,
    work_dir: Path | None = None,
) -> str:
    """Build the layer and push the image; returns the manifest's digest."""
    if base.registry != target.registry:
        raise BuildError(
            f"the base image {base} and the target {target} are in different registries; "
            "push the base image to the target's registry"
        )
    registry = Registry(target.registry, creds, insecure)
    registry.scopes = [f"repository:{target.repository}:pull,push"]
    if base.repository != target.repository:
        registry.scopes.append(f"repository:{base.repository}:pull")
    media_type, manifest = _platform_manifest(registry, base)
    base_config = json.loads(registry.blob(base.repository, manifest["config"]["digest"]))
    oci = media_type == OCI_MANIFEST
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        layer = make_layer(package, stage, Path(tmp))
        for blob in manifest["layers"]:
            _copy_blob(registry, base.repository, target.repository, blob)
        if not registry.has_blob(target.repository, layer.digest):
            with open(layer.path, "rb") as f:
                registry.upload(target.repository, layer.digest, f, layer.size)
    config = json.dumps(image_config(base_config, layer), separators=(",", ":")).encode()
    config_digest = f"sha256:{hashlib.sha256(config).hexdigest()}"
    registry.upload(target.repository, config_digest, config, len(config))
    new = dict(manifest)
    new["mediaType"] = media_type
    new["config"] = {
        "mediaType": OCI_CONFIG if oci else DOCKER_CONFIG,
        "digest": config_digest,
        "size": len(config),
    }
    new["layers"] = list(manifest["layers"]) + [
        {
            "mediaType": OCI_LAYER if oci else DOCKER_LAYER,
            "digest": layer.digest,
            "size": layer.size,
        }
    ]
    body = json.dumps(new, separators=(",", ":")).encode()
    registry.put_manifest(target.repository, target.tag, media_type, body)
    return f"sha256:{hashlib.sha256(body).hexdigest()}"


def _copy_blob(registry: Registry, source: str, repo: str, blob: dict) -> None:
    digest = blob["digest"]
    if source == repo or registry.has_blob(repo, digest):
        return
    if registry.mount(repo, digest, source):
        return
    with registry.request("GET", f"/v2/{source}/blobs/{digest}") as resp:
        registry.upload(repo, digest, resp, int(blob["size"]))


# ---- the build pod's two steps ---------------------------------------------------------------
def install(package: Path, stage: Path, python: str = sys.executable) -> int:
    """pip-install the package's requirements under ``stage`` (what the base lacks)."""
    requirements = package / REQUIREMENTS
    stage.mkdir(parents=True, exist_ok=True)
    if not requirements.is_file():
        print("no requirements.txt: nothing to install", flush=True)
        return 0
    argv = [python, "-m", "pip", "install", "--no-cache-dir", "--root", str(stage)]
    argv += ["--disable-pip-version-check", "-r", str(requirements)]
    print("+", " ".join(argv), flush=True)
    return subprocess.run(argv).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="oci_build.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    step = sub.add_parser("install", help="pip install requirements.txt under --stage")
    step.add_argument("--package", required=True)
    step.add_argument("--stage", required=True)
    step = sub.add_parser("push", help="pack and push the image")
    step.add_argument("--package", required=True)
    step.add_argument("--stage", default="")
    step.add_argument("--base", required=True, help="the base image, in the target's registry")
    step.add_argument("--target", required=True)
    step.add_argument("--insecure", action="store_true", help="plain HTTP to the registry")
    args = parser.parse_args(argv)
    package = Path(args.package)
    try:
        if not package.is_dir():
            raise BuildError(f"--package {args.package} is not a directory")
        if args.step == "install":
            return install(package, Path(args.stage))
        stage = Path(args.stage) if args.stage else None
        base, target = ImageRef.parse(args.base), ImageRef.parse(args.target)
        print(f"pushing {target} (base {base})", flush=True)
        digest = push_image(
            package,
            stage,
            base,
            target,
            Credentials.from_env(),
            args.insecure,
            Path(os.environ.get("TMPDIR", "/tmp")),
        )
        print(f"pushed {target}@{digest}", flush=True)
        return 0
    except (BuildError, OSError) as e:
        print(f"image build failed: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
