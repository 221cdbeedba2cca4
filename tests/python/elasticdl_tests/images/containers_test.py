"""The content key that decides whether the image tests rebuild a base image (no engine needed):
the same inputs give the same key, and a change to any input a build reads gives another; and
the record of the kept images, which builds of both kinds update at once."""
from __future__ import annotations

import json
from pathlib import Path

from elasticdl_tests.images.containers import (
    BASE_IMAGES_RECORD,
    image_inputs_key,
    record_base_image,
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
