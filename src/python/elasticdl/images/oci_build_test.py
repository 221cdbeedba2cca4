"""``oci_build`` against a REAL registry: Debian's ``docker-registry`` (the distribution
project's registry) on a free loopback port with its own storage, started per test module.

A base image is pushed through the same HTTP API (a layer with a file, a config with an env,
a user and a working directory), then the model-zoo image is built on it; the test reads back
the manifest, the config and the layers from the registry and checks what a job relies on.

Without the registry (scripts/container-engine/install.sh installs it) or a python3 with pip
the tests skip, or fail where ELASTICDL_REQUIRE_ENGINE is set (CI, after that install).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest
from elasticdl.images import oci_build
from elasticdl.images.oci_build import BuildError, Credentials, ImageRef, Registry

BASE_ENV = ["PATH=/usr/local/bin:/usr/bin:/bin", "PYTHONPATH=/old", "PYTHONUNBUFFERED=1"]


REQUIRE_ENV = "ELASTICDL_REQUIRE_ENGINE"


def _unavailable(message: str):
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{message} ({REQUIRE_ENV} is set)", pytrace=False)
    pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> str:
    binary = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    if not Path(binary).is_file():
        _unavailable("Debian's docker-registry is not installed (apt-get install docker-registry)")
    root = tmp_path_factory.mktemp("registry")
    port = _free_port()
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\nlog: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {root / 'data'}}}}}\n"
        f"http: {{addr: 127.0.0.1:{port}}}\n"
    )
    proc = subprocess.Popen(
        [binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    host = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://{host}/v2/", timeout=2).close()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                assert time.monotonic() < deadline, "the registry did not answer in 30 s"
                time.sleep(0.1)
        yield host
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _tar_gz(files: dict[str, bytes]) -> tuple[bytes, str]:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    diff_id = "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()
    return gzip.compress(raw.getvalue(), mtime=0), diff_id


def _push_base(host: str, repo: str, tag: str, media_type: str = oci_build.DOCKER_MANIFEST):
    reg = Registry(host, Credentials(), insecure=True)
    layer, diff_id = _tar_gz({"etc/base-release": b"base\n"})
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    reg.upload(repo, layer_digest, layer, len(layer))
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Env": BASE_ENV,
                "User": "10001:10001",
                "WorkingDir": "/home/elasticdl",
                "Cmd": ["python3"],
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created_by": "base"}],
        }
    ).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    reg.upload(repo, config_digest, config, len(config))
    oci = media_type == oci_build.OCI_MANIFEST
    manifest = {
        "schemaVersion": 2,
        "mediaType": media_type,
        "config": {
            "mediaType": oci_build.OCI_CONFIG if oci else oci_build.DOCKER_CONFIG,
            "digest": config_digest,
            "size": len(config),
        },
        "layers": [
            {
                "mediaType": oci_build.OCI_LAYER if oci else oci_build.DOCKER_LAYER,
                "digest": layer_digest,
                "size": len(layer),
            }
        ],
    }
    reg.put_manifest(repo, tag, media_type, json.dumps(manifest).encode())
    return ImageRef(host, repo, tag), layer_digest


def _package(tmp_path: Path) -> Path:
    zoo = tmp_path / "zoo"
    (zoo / "mnist" / "__pycache__").mkdir(parents=True)
    (zoo / "mnist" / "model.py").write_text("def custom_model():\n    return 1\n")
    (zoo / "mnist" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"junk")
    (zoo / "requirements.txt").write_text("pip\n")
    return zoo


def _stage(tmp_path: Path) -> Path:
    stage = tmp_path / "stage"
    site = stage / "usr/local/lib/python3.11/dist-packages/extra_dep"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("VALUE = 42\n")
    (stage / "usr/local/bin").mkdir(parents=True)
    tool = stage / "usr/local/bin/extra-tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o700)
    return stage


def _read_image(host: str, ref: ImageRef) -> tuple[str, dict, dict, list[tarfile.TarInfo], dict]:
    reg = Registry(host, Credentials(), insecure=True)
    media_type, manifest = reg.manifest(ref.repository, ref.tag)
    config = json.loads(reg.blob(ref.repository, manifest["config"]["digest"]))
    top = reg.blob(ref.repository, manifest["layers"][-1]["digest"])
    assert "sha256:" + hashlib.sha256(top).hexdigest() == manifest["layers"][-1]["digest"]
    raw = gzip.decompress(top)
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == config["rootfs"]["diff_ids"][-1]
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        members = tar.getmembers()
        contents = {m.name: tar.extractfile(m).read() for m in members if m.isfile()}
    return media_type, manifest, config, members, contents


@pytest.mark.parametrize("media_type", [oci_build.DOCKER_MANIFEST, oci_build.OCI_MANIFEST])
def test_image_is_base_plus_one_layer_like_zoo_build(registry, tmp_path, media_type):
    flavour = "oci" if media_type == oci_build.OCI_MANIFEST else "docker"
    base, base_layer = _push_base(registry, f"base-{flavour}", "cpu", media_type)
    target = ImageRef(registry, f"team/models-{flavour}", "p1")
    digest = oci_build.push_image(
        _package(tmp_path), _stage(tmp_path), base, target, Credentials(), insecure=True
    )

    got_type, manifest, config, members, contents = _read_image(registry, target)
    assert got_type == media_type
    # Base layers first (mounted into the new repository), then exactly one new layer.
    assert [layer["digest"] for layer in manifest["layers"]][:1] == [base_layer]
    assert len(manifest["layers"]) == 2 and len(config["rootfs"]["diff_ids"]) == 2
    inner = config["config"]
    assert "PYTHONPATH=/model_zoo" in inner["Env"] and "PYTHONPATH=/old" not in inner["Env"]
    assert "PYTHONUNBUFFERED=1" in inner["Env"]
    assert (inner["User"], inner["WorkingDir"], inner["Cmd"]) == (
        "10001:10001",
        "/home/elasticdl",
        ["python3"],
    )
    # The model zoo at /model_zoo, installed requirements where pip as root puts them,
    # everything root-owned and readable; no bytecode.
    assert contents["model_zoo/mnist/model.py"].startswith(b"def custom_model")
    assert contents["model_zoo/requirements.txt"] == b"pip\n"
    assert b"42" in contents["usr/local/lib/python3.11/dist-packages/extra_dep/__init__.py"]
    assert not [m.name for m in members if "__pycache__" in m.name or m.name.endswith(".pyc")]
    assert {(m.uid, m.gid) for m in members} == {(0, 0)}
    modes = {m.name: m.mode for m in members}
    assert modes["usr/local/bin/extra-tool"] & 0o755 == 0o755
    assert modes["model_zoo/mnist/model.py"] & 0o644 == 0o644
    # The digest it reports is the manifest's, as the registry serves it.
    head = urllib.request.Request(
        f"http://{registry}/v2/{target.repository}/manifests/{target.tag}",
        method="HEAD",
        headers={"Accept": oci_build.ACCEPT},
    )
    with urllib.request.urlopen(head) as resp:
        assert resp.headers["Docker-Content-Digest"] == digest


def test_same_package_gives_the_same_layer(registry, tmp_path):
    base, _ = _push_base(registry, "base-same", "cpu")
    package = _package(tmp_path)
    layers = []
    for tag in ("a", "b"):
        target = ImageRef(registry, "team/same", tag)
        oci_build.push_image(package, None, base, target, Credentials(), insecure=True)
        layers.append(_read_image(registry, target)[1]["layers"][-1]["digest"])
    assert layers[0] == layers[1]


def _python_with_pip() -> str:
    """An interpreter with pip, as the base images' python3 (Pants' test environment has none)."""
    for python in (sys.executable, shutil.which("python3") or ""):
        if (
            python
            and subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode
            == 0
        ):
            return python
    _unavailable("no python3 with pip here")


def test_install_step_installs_only_what_the_base_lacks(tmp_path):
    # The requirement (pip) is in that interpreter's environment already: nothing lands in the
    # stage, and no package index is asked.
    python = _python_with_pip()
    package = _package(tmp_path)
    stage = tmp_path / "stage-install"
    assert oci_build.install(package, stage, python) == 0
    assert stage.is_dir() and not any(stage.rglob("*.py"))


def test_errors_are_one_line(registry, tmp_path, capsys):
    package = _package(tmp_path)
    argv = ["push", f"--package={package}", "--insecure"]
    assert (
        oci_build.main(argv + [f"--base={registry}/nothing:here", f"--target={registry}/t:1"]) == 1
    )
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "HTTP 404" in err and "nothing/manifests/here" in err
    assert oci_build.main(argv + ["--base=elasticdl:cpu", f"--target={registry}/t:1"]) == 1
    assert "names no registry" in capsys.readouterr().err
    assert oci_build.main(argv + [f"--base={registry}/b:1", "--target=other.io/t:1"]) == 1
    assert "different registries" in capsys.readouterr().err
    with pytest.raises(BuildError, match="not a tag"):
        ImageRef.parse(f"{registry}/x:bad tag")


def test_runs_as_a_script_with_the_standard_library_only(registry, tmp_path):
    """The server copies the file into build pods: it must run alone, outside the package."""
    base, _ = _push_base(registry, "base-script", "cpu")
    script = tmp_path / "oci_build.py"
    shutil.copyfile(oci_build.__file__, script)
    out = subprocess.run(
        [
            sys.executable,
            "-I",
            str(script),
            "push",
            f"--package={_package(tmp_path)}",
            f"--base={base}",
            f"--target={registry}/team/script:1",
            "--insecure",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert f"pushed {registry}/team/script:1@sha256:" in out.stdout
