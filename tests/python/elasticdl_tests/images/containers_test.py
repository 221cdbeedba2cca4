"""The content key that decides whether the image tests rebuild a base image (no engine needed):
the same inputs give the same key, and a change to any input a build reads gives another; the
record of the kept images, which builds of both kinds update at once; how the tests find an
image's dependencies image; and the changed wheel the CPU image test builds from."""
from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

from elasticdl_tests.images.containers import (
    BASE_IMAGES_RECORD,
    dependencies_image,
    image_inputs_key,
    python_with_pip,
    record_base_image,
    wheel_with_extra_file,
)

FILES = {
    "dist/elasticdl-0.3.0-py3-none-any.whl": b"framework",
    "dist/elasticdl_native-0.1.0-cp311-cp311-linux_x86_64.whl": b"kernels",
    "dist/elasticdl_server-0.3.0-py3-none-any.whl": b"server",
    "deploy/docker/build-images.sh": b"#!/bin/sh",
    "deploy/docker/Dockerfile.cpu": b"FROM base",
    "deploy/docker/Dockerfile.gpu": b"FROM base AS gpu",
    "deploy/docker/README.md": b"words",
    "src/cc/kernels_cuda.cu": b"__global__",
    "pants.toml": b"[python-repos]",
}


def _checkout(root: Path) -> Path:
    for name, data in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def _key(root: Path, kind: str = "gpu", base: str = "sha256:base", flags=("--download-deps",)):
    return image_inputs_key(base, root, kind, str(root / "dist"), flags)


def test_the_same_inputs_give_the_same_key_in_another_checkout(tmp_path):
    assert _key(_checkout(tmp_path / "a")) == _key(_checkout(tmp_path / "b"))


def test_every_input_of_the_build_changes_the_key(tmp_path):
    root = _checkout(tmp_path)
    key = _key(root)
    assert _key(root, base="sha256:other-base") != key
    assert _key(root, flags=()) != key
    assert _key(root, kind="cpu") != key
    for name in (
        "dist/elasticdl-0.3.0-py3-none-any.whl",
        "dist/elasticdl_native-0.1.0-cp311-cp311-linux_x86_64.whl",
        "deploy/docker/build-images.sh",
        "deploy/docker/Dockerfile.gpu",
        "src/cc/kernels_cuda.cu",
        "pants.toml",
    ):
        (root / name).write_bytes(FILES[name] + b" changed")
        assert _key(root) != key, name
        (root / name).write_bytes(FILES[name])
    assert _key(root) == key
    (root / "dist" / "elasticdl_client-0.3.0-py3-none-any.whl").write_bytes(b"client")
    assert _key(root) != key  # a wheel more is an input more


def test_what_the_build_does_not_read_leaves_the_key(tmp_path):
    root = _checkout(tmp_path)
    gpu, cpu = _key(root), _key(root, kind="cpu")
    (root / "dist" / "elasticdl_server-0.3.0-py3-none-any.whl").write_bytes(b"edited")
    (root / "deploy" / "docker" / "README.md").write_bytes(b"edited")
    (root / "dist" / "notes.txt").write_text("not a wheel")
    assert (_key(root), _key(root, kind="cpu")) == (gpu, cpu)
    (root / "deploy" / "docker" / "Dockerfile.cpu").write_bytes(b"edited")
    assert _key(root) == gpu
    cpu = _key(root, kind="cpu")
    (root / "src" / "cc" / "kernels_cuda.cu").write_bytes(b"edited")
    assert _key(root, kind="cpu") == cpu  # the CPU image takes the kernels wheel as built


def test_a_build_records_its_kind_and_keeps_what_the_other_kind_recorded_meanwhile(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("ELASTICDL_ENGINE_DIR", str(tmp_path))
    record = tmp_path / BASE_IMAGES_RECORD
    # The GPU build started when the CPU entry was "old"; the CPU build ended during it and
    # recorded "new" (and removed the old image): the GPU build's update must keep "new".
    record.write_text(json.dumps({"cpu": {"name": "base-cpu:new"}}))
    record_base_image("gpu", {"name": "base-gpu:g1"})
    assert json.loads(record.read_text()) == {
        "cpu": {"name": "base-cpu:new"},
        "gpu": {"name": "base-gpu:g1"},
    }
    record_base_image("cpu", {"name": "base-cpu:newer"})
    assert json.loads(record.read_text())["cpu"] == {"name": "base-cpu:newer"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "base-images-record.lock",
        BASE_IMAGES_RECORD,
    ]


class _Engine:
    """The few image queries of docker.APIClient that dependencies_image makes."""

    def __init__(self, images: dict[str, list[str]]):
        self._layers = images  # name:tag -> layers

    def inspect_image(self, name):
        return {"RootFS": {"Layers": self._layers[name]}}

    def images(self, name):
        return [{"RepoTags": [t]} for t in self._layers if t.startswith(name + ":")]


def test_the_dependencies_image_is_the_one_whose_layers_are_the_images_lower_ones():
    engine = _Engine(
        {
            "img:1": ["base", "deps-a", "project"],
            "deps:gpu-a": ["base", "deps-a"],
            "deps:gpu-b": ["base", "deps-b"],
            "deps-other:gpu-a": ["base", "deps-a"],
        }
    )
    assert dependencies_image(engine, "img:1", "deps") == "deps:gpu-a"
    assert dependencies_image(engine, "img:1", "nothing") == ""


def test_a_wheel_with_an_extra_file_installs_it(tmp_path):
    """The changed framework wheel of the image test is a valid wheel that pip installs."""
    src = tmp_path / "src"
    src.mkdir()
    wheel = src / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("pkg/__init__.py", "")
        z.writestr("pkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n")
        z.writestr(
            "pkg-1.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        z.writestr("pkg-1.0.dist-info/RECORD", "pkg/__init__.py,,\npkg-1.0.dist-info/RECORD,,\n")
    (tmp_path / "out").mkdir()
    changed = wheel_with_extra_file(wheel, tmp_path / "out", "pkg/extra.py", b"X = 1\n")
    assert changed.name == wheel.name
    target = tmp_path / "site"
    subprocess.run(
        [
            python_with_pip(),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(changed),
        ],
        check=True,
    )
    assert (target / "pkg" / "extra.py").read_text() == "X = 1\n"
    record = next(target.glob("pkg-1.0.dist-info")).joinpath("RECORD").read_text()
    assert "pkg/extra.py,sha256=" in record
