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
no requirements.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import pytest
from elasticdl.client import (  # noqa: F401  (main imports it by name; this makes it a dependency)
    zoo,
)
from elasticdl.client.main import main
from elasticdl.data.datasets import prepare
from elasticdl_tests.images.engine import repo_root

BUILD_TIMEOUT_S = 1200  # a cold wheel cache downloads ~530 MB first
JOB_RECORDS = 512  # Fashion-MNIST training records of the in-container job (and test records)
RECORDS_PER_SHARD = 128
STAGE_LABEL = "org.elasticdl.install-stage"


def _pants_wheels(root: Path) -> str | None:
    checkouts = [root] + [Path(p) for p in [os.environ.get("ELASTICDL_SOURCE_ROOT", "")] if p]
    for d in [os.environ.get("ELASTICDL_WHEEL_DIR", "")] + [str(c / "dist") for c in checkouts]:
        if d and list(Path(d).glob("elasticdl-[0-9]*.whl")):
            return d
    return None


def _wheel_source(root: Path) -> tuple[Path, list[str]]:
    """(checkout whose build-images.sh runs, its wheel flags)."""
    dist = _pants_wheels(root)
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
    pytest.skip(
        "no wheels: set ELASTICDL_WHEEL_DIR (./pants package ::) or ELASTICDL_SOURCE_ROOT (a checkout)"
    )


def _python_with_pip() -> str:
    ok = (
        subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode
        == 0
    )
    return sys.executable if ok else (shutil.which("python3") or sys.executable)


def _build(engine, root: Path, tag: str, *flags: str) -> float:
    """build-images.sh cpu FLAGS --tag TAG; returns the seconds it took."""
    t0 = time.monotonic()
    r = subprocess.run(
        [
            "bash",
            str(root / "deploy" / "docker" / "build-images.sh"),
            "cpu",
            *flags,
            "--tag",
            tag,
            "--base-image",
            engine.base_image,
        ],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        env={**os.environ, "DOCKER_HOST": engine.docker_host, "PYTHON": _python_with_pip()},
    )
    assert r.returncode == 0, r.stderr[-5000:]
    return time.monotonic() - t0


def _run(client, image: str, command, timeout: float = 120, files: Path | None = None) -> str:
    """Run COMMAND in a new container of IMAGE (FILES, a directory, copied to /), return its
    output; the container is removed."""
    c = client.create_container(image, command=command, environment={"TF_CPP_MIN_LOG_LEVEL": "2"})
    try:
        if files is not None:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                tar.add(files, arcname=files.name)
            assert client.put_archive(c, "/", buf.getvalue())
        client.start(c)
        status = client.wait(c, timeout=timeout)
        logs = client.logs(c).decode()
        assert status["StatusCode"] == 0, logs[-6000:]
        return logs
    finally:
        client.remove_container(c, force=True)


def _remove_images(client, *images: str) -> None:
    for img in images:
        try:
            client.remove_image(img, force=True)
        except Exception:  # not built
            pass


@pytest.fixture(scope="module")
def real_image(engine):
    """The CPU base image with TensorFlow and every dependency, built offline from the host's
    wheel cache: (name, build seconds)."""
    root = repo_root()
    dist = _pants_wheels(root)
    if dist is None:
        pytest.skip(
            "the real image installs the Pants wheels with their declared requirements: "
            "set ELASTICDL_WHEEL_DIR or run ./pants package //:elasticdl-wheel "
            "src/python:elasticdl-client-wheel src/cc:native"
        )
    name = f"elasticdl-test/base-cpu:{uuid.uuid4().hex[:12]}"
    # Install-stage images an earlier, interrupted build left behind are not this build's.
    earlier = set(_stage_images(engine.client()))
    try:
        yield name, _build(engine, root, name, "--dist", dist, "--download-deps"), earlier
    finally:
        _remove_images(engine.client(), name)


def _stage_images(client) -> list:
    """Ids of the install-stage images the build script did not mark as kept."""
    return [
        i["Id"]
        for i in client.images(all=True, filters={"label": STAGE_LABEL})
        if (i.get("Labels") or {}).get(STAGE_LABEL) not in ("", "kept")
    ]


def test_real_cpu_image_has_tensorflow_framework_and_kernels_but_no_wheels(
    engine, real_image, capsys
):
    image, build_s, earlier = real_image
    client = engine.client()
    out = _run(
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
    # The wheels (~500 MB) stayed in the install stage: no layer of the image copies them, and
    # the build script deleted that stage's images.
    assert not any("/tmp/wheels" in h["CreatedBy"] for h in client.history(image))
    assert _run(client, image, ["ls", "/tmp"]).strip() == ""
    leftovers = [i[:19] for i in _stage_images(client) if i not in earlier]
    assert leftovers == []
    with capsys.disabled():
        print(f"\nreal CPU base image (TensorFlow + dependency closure): built in {build_s:.1f}s")


def test_model_zoo_image_trains_fashion_mnist_in_a_container(
    docker_env, real_image, tmp_path, monkeypatch, capsys
):
    base, _, _ = real_image
    client = docker_env.client()
    # A tiny Fashion-MNIST (the first records of each split), prepared on this host.
    data = tmp_path / "data"
    prepared = prepare(
        "fashion_mnist",
        str(data),
        progress=False,
        limit=JOB_RECORDS,
        records_per_shard=RECORDS_PER_SHARD,
    )
    assert prepared.counts == {"train": JOB_RECORDS, "test": JOB_RECORDS}

    # The model zoo's mnist package in a zoo image: `zoo init` + `zoo build`.
    ctx = tmp_path / "ctx"
    shutil.copytree(
        repo_root() / "model_zoo" / "mnist",
        ctx / "zoo" / "mnist",
        ignore=shutil.ignore_patterns("__pycache__", "BUILD", "*_test.py"),
    )
    zoo_image = f"elasticdl-test/zoo-mnist:{uuid.uuid4().hex[:12]}"
    monkeypatch.chdir(ctx)
    try:
        assert main(["zoo", "init", f"--base_image={base}", "--model_zoo=zoo"]) == 0
        assert main(["zoo", "build", f"--image={zoo_image}", "."]) == 0, capsys.readouterr().err
        job = "image-mnist"
        script = (
            "elasticdl train --platform=local --model_zoo=/model_zoo "
            "--model_def=mnist.mnist_functional_api.custom_model "
            "--training_data=/data/train --validation_data=/data/test --num_epochs=1 "
            "--minibatch_size=64 --num_minibatches_per_task=2 --num_workers=2 --num_ps_pods=1 "
            f"--job_name={job}; rc=$?; "
            "python3 -c 'import elasticdl.ops as ops; print(\"OPS_BACKEND\", ops.backend())'; "
            f"echo STATUS_JSON; cat $HOME/.elasticdl/jobs/{job}/status.json; exit $rc"
        )
        t0 = time.monotonic()
        out = _run(client, zoo_image, ["sh", "-c", script], timeout=600, files=data)
        job_s = time.monotonic() - t0
    finally:
        _remove_images(client, zoo_image)

    assert re.search(r"^OPS_BACKEND native$", out, re.M), out[-3000:]
    summary = re.search(rf"Job {job} succeeded: trained (\d+)/(\d+) records", out)
    assert summary, out[-6000:]
    assert summary.group(1) == summary.group(2) == str(JOB_RECORDS)
    status = json.loads(out.split("STATUS_JSON", 1)[1])
    assert status["phase"] == "Succeeded"
    assert status["records_trained"] == status["records_expected"] == JOB_RECORDS
    assert status["records_trained_per_epoch"] == {"1": JOB_RECORDS}
    assert status["tasks_failed"] == 0 and status["tasks_retried"] == 0
    assert status["model_version"] == JOB_RECORDS // 64  # one PS version per minibatch
    assert "accuracy" in status["evaluation_metrics"]
    workers = [r for r in status["replicas"] if r["type"] == "worker"]
    assert len(workers) == 2 and all(r["exit_code"] == 0 for r in workers)
    with capsys.disabled():
        print(
            f"\nin-container job: {JOB_RECORDS} records trained, "
            f"accuracy {status['evaluation_metrics']['accuracy']:.3f}, {job_s:.1f}s"
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
        out = _run(
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
        _remove_images(client, image)
    with capsys.disabled():
        print(f"\nlight CPU base image ({' '.join(source)}): built in {build_s:.1f}s")
