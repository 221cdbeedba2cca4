"""Helpers of the image tests: build a base image with deploy/docker/build-images.sh (once per
content of its inputs, on the dependencies image kept from earlier builds), run a command in a
container, and the in-container training job both base-image tests run."""

from __future__ import annotations

import base64
import fcntl
import hashlib
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
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from elasticdl.client import (  # noqa: F401  (main imports it by name; this makes it a dependency)
    zoo,
)
from elasticdl.client.main import main
from elasticdl.data.datasets import prepare
from elasticdl_tests.images.engine import engine_dir, repo_root

JOB_RECORDS = 512  # Fashion-MNIST training records of the in-container job (and test records)
RECORDS_PER_SHARD = 128
MINIBATCH = 64
STAGE_LABEL = "org.elasticdl.install-stage"
REQUIRE_ENV = "ELASTICDL_REQUIRE_ENGINE"
# What the engine holds of the base images built by the tests: kind -> inputs key, image id,
# install-stage id, dependencies image and its id (see cached_base_image).
BASE_IMAGES_RECORD = "base-images.json"
# The project's wheels add a layer of a few MB to the dependencies image (the CUDA kernels
# included); anything near this means third-party packages went into the project's layer.
PROJECT_LAYERS_MAX_BYTES = 50e6


def unavailable(message: str):
    """Skip with the reason; under CI (ELASTICDL_REQUIRE_ENGINE, which scripts/run-tests.sh
    exports once it set up the engine and built the wheels) fail with it instead."""
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{message} ({REQUIRE_ENV} is set)", pytrace=False)
    pytest.skip(message)


def pants_wheels(root: Path) -> str | None:
    """$ELASTICDL_WHEEL_DIR, or dist/ of this checkout or $ELASTICDL_SOURCE_ROOT, when it holds
    the framework wheel."""
    checkouts = [root] + [Path(p) for p in [os.environ.get("ELASTICDL_SOURCE_ROOT", "")] if p]
    for d in [os.environ.get("ELASTICDL_WHEEL_DIR", "")] + [str(c / "dist") for c in checkouts]:
        if d and list(Path(d).glob("elasticdl-[0-9]*.whl")):
            return d
    return None


def python_with_pip() -> str:
    ok = (
        subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode
        == 0
    )
    return sys.executable if ok else (shutil.which("python3") or sys.executable)


def build_image(
    engine, root: Path, kind: str, tag: str, *flags: str, timeout: float, stage_id: str = ""
) -> float:
    """ROOT's build-images.sh KIND FLAGS --tag TAG on the engine's base image; returns the
    seconds it took. STAGE_ID labels its install-stage images (see ``stage_images``)."""
    t0 = time.monotonic()
    r = subprocess.run(
        [
            "bash",
            str(root / "deploy" / "docker" / "build-images.sh"),
            kind,
            *flags,
            "--tag",
            tag,
            "--base-image",
            engine.base_image,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={
            **os.environ,
            "DOCKER_HOST": engine.docker_host,
            "PYTHON": python_with_pip(),
            "ELASTICDL_INSTALL_STAGE_ID": stage_id,
        },
    )
    assert r.returncode == 0, r.stderr[-5000:]
    return time.monotonic() - t0


def _input_files(root: Path, kind: str, dist: str) -> list[tuple[str, Path]]:
    """(name, path) of every file a build of KIND from DIST reads. In a checkout and in Pants'
    sandbox alike (the test's dependencies: deploy/docker's files, pants.toml, src/cc)."""
    # The server's wheel is not in the base images (build-images.sh leaves it to KIND server).
    wheels = sorted(
        w for w in Path(dist).glob("*.whl") if not w.name.startswith("elasticdl_server-")
    )
    files = [(f"wheel/{w.name}", w) for w in wheels]
    docker = root / "deploy" / "docker"
    inputs = [docker / "build-images.sh", docker / f"Dockerfile.{kind}"]
    if kind == "gpu":  # build-images.sh compiles the CUDA kernels from these
        cc = root / "src" / "cc"
        inputs += sorted(
            p for p in cc.iterdir() if p.suffix in (".py", ".toml", ".cc", ".h", ".cu")
        )
    files += [(str(p.relative_to(root)), p) for p in inputs]
    # build-images.sh --download-deps takes the package sources from [python-repos].
    if (root / "pants.toml").is_file():
        files.append(("pants.toml", root / "pants.toml"))
    return files


def image_inputs_key(base_id: str, root: Path, kind: str, dist: str, flags: tuple[str, ...]) -> str:
    """sha256 of what a base image of KIND is built from: its flags, the engine's OS base
    image (BASE_ID), the wheels it installs, the build script and Dockerfile and, for gpu, the
    kernels' sources."""
    digest = hashlib.sha256()
    digest.update(f"{kind}\n{' '.join(flags)}\n{base_id}\n".encode())
    for name, path in _input_files(root, kind, dist):
        digest.update(f"{name}\n{path.stat().st_size}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def deps_repository(kind: str) -> str:
    """Where build-images.sh keeps the dependencies image of the tests' KIND base image."""
    return f"elasticdl-test/deps-{kind}"


@dataclass
class BaseImage:
    name: str
    seconds: float  # what this call spent building it; 0 when reused
    stage_id: str  # its build's install-stage label (see ``stage_images``)
    key: str  # its inputs key
    deps: str  # the dependencies image it is built on (see ``dependencies_image``)


def cached_base_image(
    engine, root: Path, kind: str, dist: str, *flags: str, timeout: float
) -> BaseImage:
    """The base image of KIND (``build-images.sh KIND --dist DIST FLAGS``), built only when
    its inputs changed.

    The engine keeps one image per kind, tagged with its inputs key and recorded beside the
    engine (kind -> inputs key, image id, install-stage id, dependencies image); a later test
    process -- another file, or the next run -- whose inputs hash the same and whose tags still
    point at the recorded ids uses it. The tests then check the image as they check a fresh
    build. Every other tag of its kind's repository is removed (only this module tags
    ``elasticdl-test/base-<kind>``): the GPU image is ~9 GB and the CPU one ~2.4 GB.

    The dependencies image (``deps_repository(kind)``) stays: build-images.sh keeps one per
    kind, the one of the newest build's third-party inputs, and builds it again only when those
    change. So a change to the project's sources builds a layer of the project's wheels on it
    (about a minute), and removing the previous image frees only that image's own layers.
    """
    client = engine.client()
    with open(engine_dir() / f"base-image-{kind}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a parallel test file waits for this build
        base_id = client.inspect_image(engine.base_image)["Id"]
        flags = (*flags, "--deps-repository", deps_repository(kind))
        key = image_inputs_key(base_id, root, kind, dist, flags)
        repository = f"elasticdl-test/base-{kind}"
        name = f"{repository}:{key[:24]}"
        recorded = _read_base_records().get(kind) or {}
        if (
            recorded.get("inputs") == key
            and _image_id(client, name) == recorded.get("id")
            and recorded.get("deps")
            and _image_id(client, recorded["deps"]) == recorded.get("deps_id")
        ):
            seconds, stage_id, deps = 0.0, recorded["stage_id"], recorded["deps"]
        else:
            stage_id = f"test-{uuid.uuid4().hex}"
            seconds = build_image(
                engine, root, kind, name, "--dist", dist, *flags, timeout=timeout, stage_id=stage_id
            )
            deps = dependencies_image(client, name, deps_repository(kind))
            record_base_image(
                kind,
                {
                    "inputs": key,
                    "id": _image_id(client, name),
                    "stage_id": stage_id,
                    "name": name,
                    "deps": deps,
                    "deps_id": _image_id(client, deps),
                },
            )
        remove_images(client, *(tag for tag in repository_tags(client, repository) if tag != name))
        return BaseImage(name, seconds, stage_id, key, deps)


def image_layers(client, image: str) -> list[str]:
    """IMAGE's layers (their content digests), the base image's first."""
    return client.inspect_image(image)["RootFS"]["Layers"]


def dependencies_image(client, image: str, repository: str) -> str:
    """The image of REPOSITORY that IMAGE is built on: the one tag whose layers are IMAGE's
    lower layers ("" when none is)."""
    layers = image_layers(client, image)
    below = [
        tag
        for tag in repository_tags(client, repository)
        if layers[: len(image_layers(client, tag))] == image_layers(client, tag)
    ]
    return below[0] if len(below) == 1 else ""


def assert_built_on_its_dependencies_image(client, base: BaseImage, kind: str) -> None:
    """BASE is the one dependencies image kept for KIND (its lower layers) plus the project's
    wheels, a few MB: what a change to the project's sources rebuilds."""
    repository = deps_repository(kind)
    assert base.deps and repository_tags(client, repository) == [base.deps]
    assert dependencies_image(client, base.name, repository) == base.deps
    assert len(image_layers(client, base.name)) > len(image_layers(client, base.deps))
    added = client.inspect_image(base.name)["Size"] - client.inspect_image(base.deps)["Size"]
    assert 0 < added < PROJECT_LAYERS_MAX_BYTES, added


def wheel_with_extra_file(wheel: Path, dest: Path, arcname: str, data: bytes) -> Path:
    """A copy of WHEEL in the directory DEST holding one file more, ARCNAME, listed in its
    RECORD (a change to the project's sources, as a rebuilt wheel carries it)."""
    out = dest / wheel.name
    digest = hashlib.sha256(data).digest()
    line = (
        f"{arcname},sha256={base64.urlsafe_b64encode(digest).rstrip(b'=').decode()},{len(data)}\n"
    )
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            content = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                content = line.encode() + content
            dst.writestr(info, content)
        dst.writestr(arcname, data)
    return out


def repository_tags(client, repository: str) -> list[str]:
    """The tags of REPOSITORY (``name:tag``) in the engine."""
    return sorted(
        tag
        for image in client.images(name=repository)
        for tag in image.get("RepoTags") or []
        if tag.startswith(f"{repository}:")
    )


def _read_base_records() -> dict:
    try:
        return json.loads((engine_dir() / BASE_IMAGES_RECORD).read_text())
    except (OSError, ValueError):
        return {}


def record_base_image(kind: str, entry: dict) -> None:
    """Replace KIND's entry of the record, re-read under the record's own lock: builds of the
    two kinds run at once under their own locks, and a write of the whole record read before
    the other's build ended would bring back the other kind's previous entry (and leave its
    image, no longer recorded, behind)."""
    path = engine_dir() / BASE_IMAGES_RECORD
    with open(engine_dir() / "base-images-record.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        records = _read_base_records()
        records[kind] = entry
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(records, indent=1))
        tmp.replace(path)


def _image_id(client, name: str) -> str | None:
    try:
        return client.inspect_image(name)["Id"]
    except Exception:  # not there (docker.errors.ImageNotFound)
        return None


def run(client, image: str, command, timeout: float = 120, files: Path | None = None) -> str:
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


def copy_out(client, image: str, path: str, dest: Path) -> Path:
    """The file PATH of IMAGE, copied to the directory DEST (no container is started)."""
    c = client.create_container(image, command=["true"])
    try:
        stream, _ = client.get_archive(c, path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            tar.extractall(dest, filter="data")
        return dest / Path(path).name
    finally:
        client.remove_container(c, force=True)


def remove_images(client, *images: str) -> None:
    for img in images:
        try:
            client.remove_image(img, force=True)
        except Exception:  # not built
            pass


def stage_images(client, stage_id: str) -> list:
    """Ids of the install-stage images of the build labelled STAGE_ID (builds of other tests
    may run beside it on the same engine)."""
    return [
        i["Id"] for i in client.images(all=True, filters={"label": f"{STAGE_LABEL}={stage_id}"})
    ]


@dataclass
class JobResult:
    output: str  # the container's whole output
    status: dict  # the job's status.json
    seconds: float  # the container's run time (all its jobs)


PS_JOB = "--num_ps_pods=1"
ALLREDUCE_JOB = "--distribution_strategy=AllreduceStrategy"


def train_mnist_in_zoo_image(
    client, base: str, tmp_path: Path, monkeypatch, jobs: tuple[str, ...] = (PS_JOB,)
) -> list[JobResult]:
    """A zoo image of model_zoo/mnist on BASE (`zoo init` + `zoo build`) runs real
    `elasticdl train --platform=local` jobs one after another in one container (master, PS and
    2 workers as processes there), one per JOBS entry (its extra flags), on JOB_RECORDS
    Fashion-MNIST records prepared on this host."""
    data = tmp_path / "data"
    prepared = prepare(
        "fashion_mnist",
        str(data),
        progress=False,
        limit=JOB_RECORDS,
        records_per_shard=RECORDS_PER_SHARD,
    )
    assert prepared.counts == {"train": JOB_RECORDS, "test": JOB_RECORDS}

    ctx = tmp_path / "ctx"
    shutil.copytree(
        repo_root() / "model_zoo" / "mnist",
        ctx / "zoo" / "mnist",
        ignore=shutil.ignore_patterns("__pycache__", "BUILD", "*_test.py"),
    )
    zoo_image = f"elasticdl-test/zoo-mnist:{uuid.uuid4().hex[:12]}"
    monkeypatch.chdir(ctx)
    script = ["rc=0"]
    for n, flags in enumerate(jobs):
        job = f"image-mnist-{n}"
        script.append(
            "elasticdl train --platform=local --model_zoo=/model_zoo "
            "--model_def=mnist.mnist_functional_api.custom_model "
            "--training_data=/data/train --validation_data=/data/test --num_epochs=1 "
            f"--minibatch_size={MINIBATCH} --num_minibatches_per_task=2 --num_workers=2 "
            # No backup tasks: a copy pushes its minibatches twice, and the model version
            # checked below counts every push.
            "--straggler_factor=0 "
            f"{flags} --job_name={job} || rc=$?; "
            f"echo STATUS_JSON; cat $HOME/.elasticdl/jobs/{job}/status.json; echo; echo END_JSON"
        )
    script.append(
        "python3 -c 'import elasticdl.ops as ops; print(\"OPS_BACKEND\", ops.backend())'; exit $rc"
    )
    try:
        assert main(["zoo", "init", f"--base_image={base}", "--model_zoo=zoo"]) == 0
        assert (ctx / "Dockerfile").read_text().count(f"FROM {base}\n") == 1
        assert main(["zoo", "build", f"--image={zoo_image}", "."]) == 0
        t0 = time.monotonic()
        out = run(client, zoo_image, ["sh", "-c", "; ".join(script)], timeout=900, files=data)
        seconds = time.monotonic() - t0
    finally:
        remove_images(client, zoo_image)
    assert re.search(r"^OPS_BACKEND native$", out, re.M), out[-3000:]
    results = []
    for n, part in enumerate(out.split("STATUS_JSON")[1:]):
        summary = re.search(rf"Job image-mnist-{n} succeeded: trained (\d+)/(\d+) records", out)
        assert summary, out[-6000:]
        status = json.loads(part.split("END_JSON", 1)[0])
        results.append(JobResult(out, status, seconds))
    assert len(results) == len(jobs), out[-6000:]
    return results


def assert_trained_every_record(result: JobResult, ps: bool = True) -> None:
    status = result.status
    assert status["phase"] == "Succeeded", status
    assert status["records_trained"] == status["records_expected"] == JOB_RECORDS
    assert status["records_trained_per_epoch"] == {"1": JOB_RECORDS}
    assert status["tasks_failed"] == 0 and status["tasks_retried"] == 0
    if ps:
        # One version per minibatch.
        assert status["model_version"] == JOB_RECORDS // MINIBATCH, status
    assert "accuracy" in status["evaluation_metrics"]
    workers = [r for r in status["replicas"] if r["type"] == "worker"]
    assert len(workers) == 2 and all(r["exit_code"] == 0 for r in workers)
