"""The CPU base image (deploy/docker/Dockerfile.cpu) built with deploy/docker/build-images.sh
on a REAL engine, the way a job uses it:

* the real image: the project's wheels + TensorFlow (tensorflow-cpu, the Dockerfile's pin) +
  the full dependency closure of the wheels, downloaded once per machine on the host
  (``--download-deps``, into ``$ELASTICDL_CACHE_DIR`` or ``~/.cache/elasticdl``) and installed
  offline WITH dependency resolution (``--no-index``), so that an incomplete Requires-Dist of a
  wheel fails the build. A model-zoo image of ``model_zoo/mnist`` (``zoo init`` + ``zoo build``)
  on top of it then runs a real ``elasticdl train --platform=local`` job in a container (master,
  PS and workers as processes there) on a tiny Fashion-MNIST RecordIO dataset, which must train
  every record;
* the light image (``--tensorflow ""``, numpy only, ``--no-index --no-deps``): the framework and
  its native kernels, without TensorFlow.

Wheels: $ELASTICDL_WHEEL_DIR or dist/ (``./pants package ::``) when they hold elasticdl-*.whl;
the light image also builds from the source tree -- this checkout, or $ELASTICDL_SOURCE_ROOT
under Pants -- (dev wheel of src/python + dist's elasticdl_native wheel or ``pip wheel src/cc``,
1-2 min of C++ compile). The real image needs the Pants wheels: the development wheel declares
no requirements. Without wheels the tests skip, or fail where ELASTICDL_REQUIRE_ENGINE is set
(CI, where scripts/run-tests.sh builds them).

The real image is built once per content of its inputs (``containers.cached_base_image``: the
wheels, the build script and Dockerfile, the engine's OS base image) and kept in the engine;
a run whose inputs are unchanged checks the image it finds. It is a layer of the project's
wheels on a dependencies image (TensorFlow and the rest of the third-party closure), which
build-images.sh builds only when the third-party inputs change and keeps; a test builds the
image again from a changed framework wheel and checks that only the project's layer is new.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

import pytest
from elasticdl_tests.images.containers import (
    JOB_RECORDS,
    PROJECT_LAYERS_MAX_BYTES,
    assert_built_on_its_dependencies_image,
    assert_trained_every_record,
    build_image,
    cached_base_image,
    dependencies_image,
    deps_repository,
    image_layers,
    pants_wheels,
    remove_images,
    repository_tags,
    run,
    stage_images,
    train_mnist_in_zoo_image,
    unavailable,
    wheel_with_extra_file,
)
from elasticdl_tests.images.engine import repo_root

BUILD_TIMEOUT_S = 1200  # a cold wheel cache downloads ~530 MB first


def _wheel_source(root: Path) -> tuple[Path, list[str]]:
    """(checkout whose build-images.sh runs, its wheel flags)."""
    dist = pants_wheels(root)
    if dist:
        return root, ["--dist", dist]
    checkouts = [root] + [Path(p) for p in [os.environ.get("ELASTICDL_SOURCE_ROOT", "")] if p]
    for c in checkouts:
        # Under Pants the sandbox holds only this test's inputs; ELASTICDL_SOURCE_ROOT names
        # the checkout to build from.
        if (c / "src" / "cc" / "setup.py").is_file() and (
            c / "src" / "python" / "elasticdl"
        ).is_dir():
            return c, ["--from-source"]
    unavailable(
        "no wheels: set ELASTICDL_WHEEL_DIR (./pants package ::) or ELASTICDL_SOURCE_ROOT (a checkout)"
    )


def _build(engine, root: Path, tag: str, *flags: str) -> float:
    """build-images.sh cpu FLAGS --tag TAG; returns the seconds it took."""
    return build_image(engine, root, "cpu", tag, *flags, timeout=BUILD_TIMEOUT_S)


@pytest.fixture(scope="module")
def real_image(engine):
    """The CPU base image with TensorFlow and every dependency, built offline from the host's
    wheel cache, or the one built earlier from the same inputs (a ``containers.BaseImage``)."""
    root = repo_root()
    dist = pants_wheels(root)
    if dist is None:
        unavailable(
            "the real image installs the Pants wheels with their declared requirements: "
            "set ELASTICDL_WHEEL_DIR or run ./pants package //:elasticdl-wheel "
            "src/python:elasticdl-client-wheel src/cc:native"
        )
    return cached_base_image(engine, root, "cpu", dist, "--download-deps", timeout=BUILD_TIMEOUT_S)


def test_real_cpu_image_has_tensorflow_framework_and_kernels_but_no_wheels(
    engine, real_image, capsys
):
    image, build_s = real_image.name, real_image.seconds
    client = engine.client()
    out = run(
        client,
        image,
        [
            "python3",
            "-c",
            "import numpy as np, tensorflow as tf, elasticdl.ops as ops, elasticdl.worker.main, "
            "elasticdl.master.main, elasticdl.ps.main\n"
            "p = np.ones(4, np.float32); ops.sgd(p, np.full(4, 0.5, np.float32), 0.1)\n"
            "print('RESULT', tf.__version__, ops.backend(), *p.tolist())",
        ],
    )
    result = re.search(r"^RESULT (.*)$", out, re.M)
    assert result, out[-3000:]
    version, backend, *values = result.group(1).split()
    assert version == "2.16.2" and backend == "native"
    assert [float(x) for x in values] == pytest.approx([0.95] * 4)
    # The wheels (~500 MB) stayed in the install stages (of the dependencies and of the
    # project): no layer of the image copies them, nor the project's staging tree, and the
    # build script deleted those stages' images.
    assert not any("/tmp/wheels" in h["CreatedBy"] for h in client.history(image))
    assert run(client, image, ["sh", "-c", "test ! -e /staging && ls /tmp"]).strip() == ""
    assert [i[:19] for i in stage_images(client, real_image.stage_id)] == []
    # One CPU base image is kept in the engine, whatever earlier runs built, and the
    # dependencies image under it, to which the project's wheels add a few MB.
    assert repository_tags(client, "elasticdl-test/base-cpu") == [image]
    assert_built_on_its_dependencies_image(client, real_image, "cpu")
    built = f"built in {build_s:.1f}s" if build_s else "reused (its inputs are unchanged)"
    with capsys.disabled():
        print(f"\nreal CPU base image (TensorFlow + dependency closure): {built}")


def test_model_zoo_image_trains_fashion_mnist_in_a_container(
    docker_env, real_image, tmp_path, monkeypatch, capsys
):
    base = real_image.name
    (result,) = train_mnist_in_zoo_image(docker_env.client(), base, tmp_path, monkeypatch)
    assert_trained_every_record(result)
    with capsys.disabled():
        print(
            f"\nin-container job: {JOB_RECORDS} records trained, "
            f"accuracy {result.status['evaluation_metrics']['accuracy']:.3f}, {result.seconds:.1f}s"
        )


def test_light_cpu_image_without_tensorflow(engine, capsys):
    """`--tensorflow ""`: the framework and its kernels only (numpy installed offline)."""
    root, source = _wheel_source(repo_root())
    image = f"elasticdl-test/base-cpu-light:{uuid.uuid4().hex[:12]}"
    client = engine.client()
    try:
        build_s = _build(
            engine,
            root,
            image,
            *source,
            "--tensorflow",
            "",
            "--pip-options",
            "--no-index --no-deps",
            "--wheel",
            "numpy==1.26.4",
        )
        out = run(
            client,
            image,
            [
                "python3",
                "-c",
                "import importlib.util as u, numpy as np, elasticdl, elasticdl.ops as ops\n"
                "p = np.ones(4, np.float32); ops.sgd(p, np.full(4, 0.5, np.float32), 0.1)\n"
                "print(u.find_spec('tensorflow') is None, ops.backend(), *p.tolist())",
            ],
        ).split()
        assert out[:2] == ["True", "native"]
        assert [float(x) for x in out[2:]] == pytest.approx([0.95] * 4)
    finally:
        remove_images(client, image)
    with capsys.disabled():
        print(f"\nlight CPU base image ({' '.join(source)}): built in {build_s:.1f}s")


def test_a_change_to_the_project_rebuilds_only_its_layer(engine, real_image, tmp_path, capsys):
    """The framework wheel with one file more (what a change to the sources does to it) builds
    on the kept dependencies image, which is neither rebuilt nor replaced: the new image is that
    image plus a few MB of the project's wheels, holding the change."""
    root = repo_root()
    client = engine.client()
    deps_id = client.inspect_image(real_image.deps)["Id"]
    changed = tmp_path / "dist"
    changed.mkdir()
    for wheel in Path(pants_wheels(root)).glob("*.whl"):
        if wheel.name.startswith("elasticdl-"):
            wheel_with_extra_file(
                wheel, changed, "elasticdl/image_test_change.py", b"CHANGED = 1\n"
            )
        else:
            shutil.copy(wheel, changed)
    image = f"elasticdl-test/base-cpu-changed:{uuid.uuid4().hex[:12]}"
    try:
        build_s = _build(
            engine,
            root,
            image,
            "--dist",
            str(changed),
            "--download-deps",
            "--deps-repository",
            deps_repository("cpu"),
        )
        out = run(
            client,
            image,
            [
                "python3",
                "-c",
                "import elasticdl.image_test_change as c; print('CHANGED', c.CHANGED)",
            ],
        )
        assert re.search(r"^CHANGED 1$", out, re.M), out[-3000:]
        assert client.inspect_image(real_image.deps)["Id"] == deps_id
        assert repository_tags(client, deps_repository("cpu")) == [real_image.deps]
        assert dependencies_image(client, image, deps_repository("cpu")) == real_image.deps
        deps_layers = len(image_layers(client, real_image.deps))
        assert (
            image_layers(client, image)[:deps_layers]
            == image_layers(client, real_image.name)[:deps_layers]
        )
        added = client.inspect_image(image)["Size"] - client.inspect_image(real_image.deps)["Size"]
        assert 0 < added < PROJECT_LAYERS_MAX_BYTES, added
    finally:
        remove_images(client, image)
    with capsys.disabled():
        print(f"\nCPU base image after a change to the framework wheel: built in {build_s:.1f}s")
