"""``elasticdl zoo init/build/push`` against a REAL Docker engine and registry (see conftest).

Everything goes through the real CLI entry point (``elasticdl.client.main.main``) in-process,
the real engine API and a real registry on 127.0.0.1:5000. Each test uses fresh content
(a random token) so that build-cache hits from earlier runs cannot fake a result. What a
rebuild saves is asserted as the layers it reuses; its time is a benchmark
(benchmarks/images/zoo_rebuild.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import urllib.request
import uuid
import zipfile
from pathlib import Path

import pytest
from elasticdl.client import (  # noqa: F401  (main imports it by name; this makes it a dependency)
    zoo,
)
from elasticdl.client.main import main

STEP = re.compile(r"^\[(\d+)/(\d+)\] (.*)$")
SUMMARY = re.compile(r"built (\S+) \((sha256:[0-9a-f]+)\) in ([0-9.]+)s, (\d+)/(\d+) steps cached")


def _wheel(out_dir: Path, token: str) -> Path:
    """A tiny real wheel ``zoo_helper`` (a model dependency served from --local_pkg_dir)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "zoo_helper-1.0-py3-none-any.whl"
    files = {
        "zoo_helper/__init__.py": f"TOKEN = {token!r}\n".encode(),
        "zoo_helper-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: zoo-helper\nVersion: 1.0\n",
        "zoo_helper-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        zf.writestr(
            "zoo_helper-1.0.dist-info/RECORD",
            "\n".join(record + ["zoo_helper-1.0.dist-info/RECORD,,"]) + "\n",
        )
    return path


def _model_zoo(ctx: Path, token: str) -> None:
    zoo = ctx / "model_zoo"  # noqa: F811  (a directory here, not the module)
    (zoo / "mnist").mkdir(parents=True)
    (zoo / "mnist" / "__init__.py").write_text("")
    (zoo / "mnist" / "model.py").write_text("VERSION = 1\n")
    (zoo / "requirements.txt").write_text(f"zoo-helper==1.0  # {token}\n")
    _wheel(ctx / "pkgs", token)


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _run(client, image: str, code: str) -> str:
    container = client.create_container(image, command=["python3", "-c", code])
    try:
        client.start(container)
        status = client.wait(container, timeout=120)
        logs = client.logs(container).decode()
        assert status["StatusCode"] == 0, logs
        return logs
    finally:
        client.remove_container(container, force=True)


def _assert_one_error_line(rc: int, err: str, *needles: str) -> str:
    assert rc != 0
    assert "Traceback" not in err
    errors = [ln for ln in err.splitlines() if ln.startswith("elasticdl: error:")]
    assert len(errors) == 1, err
    assert err.rstrip().splitlines()[-1] == errors[0]
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def test_build_streams_progress_and_reuses_dependency_layers(
    docker_env, tmp_path, monkeypatch, capsys
):
    token = uuid.uuid4().hex
    ctx = tmp_path / "ctx"
    _model_zoo(ctx, token)
    monkeypatch.chdir(ctx)
    image = f"elasticdl-test/zoo-{token[:12]}:v1"
    client = docker_env.client()

    rc, _, err = _cli(
        capsys,
        "zoo",
        "init",
        f"--base_image={docker_env.base_image}",
        "--model_zoo=model_zoo",
        "--local_pkg_dir=pkgs",
    )
    assert rc == 0, err
    try:
        rc, out, err = _cli(capsys, "zoo", "build", f"--image={image}", ".")
        assert rc == 0, err
        steps = [STEP.match(ln) for ln in err.splitlines() if STEP.match(ln)]
        assert [int(m[1]) for m in steps] == list(
            range(1, int(steps[0][2]) + 1)
        )  # every step shown
        assert any(
            "Successfully installed zoo-helper-1.0" in ln for ln in err.splitlines()
        ), err  # RUN output
        first = SUMMARY.search(err)
        # Fresh content: nothing cached from the first COPY on. `USER root` right after FROM
        # may come from the cache when any earlier build on the same base image made it.
        first_cached = _cached_instructions(err)
        assert first and int(first[4]) == len(first_cached), err
        assert all(i == "USER root" for i in first_cached), err
        first_id = out.strip()
        assert first_id.startswith(first[2]) and first_id == client.inspect_image(image)["Id"]

        # Edit only a model file: the dependency layers must come from the cache.
        (ctx / "model_zoo" / "mnist" / "model.py").write_text("VERSION = 2\n")
        rc, out, err = _cli(capsys, "zoo", "build", f"--image={image}", ".")
        assert rc == 0, err
        second = SUMMARY.search(err)
        cached = _cached_instructions(err)
        assert any(
            i.startswith("RUN") and "-r /model_zoo/requirements.txt" in i for i in cached
        ), err
        assert any(i.startswith("RUN") and "elasticdl_pkgs/*.whl" in i for i in cached), err
        assert not any(i.startswith("COPY model_zoo ") for i in cached), err
        # USER root (the base images run as a non-root user), COPY pkgs, RUN pip pkgs,
        # COPY requirements, RUN pip -r
        assert int(second[4]) == 5
        assert out.strip() != first_id

        # Same layers below the model code, a new top layer.
        layers1 = client.inspect_image(first_id)["RootFS"]["Layers"]
        layers2 = client.inspect_image(out.strip())["RootFS"]["Layers"]
        assert layers1[:-1] == layers2[:-1] and layers1[-1] != layers2[-1]
        assert _run(
            client, image, "import zoo_helper, mnist.model as m; print(zoo_helper.TOKEN, m.VERSION)"
        ).split() == [token, "2"]
    finally:
        for img in {image, first_id if "first_id" in locals() else image}:
            try:
                client.remove_image(img, force=True)
            except Exception:  # already gone
                pass


def _cached_instructions(err: str) -> list[str]:
    lines = err.splitlines()
    out = []
    for i, ln in enumerate(lines):
        m = STEP.match(ln)
        if m and i + 1 < len(lines) and lines[i + 1].strip() == "(cached)":
            out.append(m[3])
    return out


def _registry_json(path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:5000{path}", timeout=10) as r:
        return json.loads(r.read())


def test_push_to_local_registry_then_pull(docker_env, tmp_path, monkeypatch, capsys):
    token = uuid.uuid4().hex[:12]
    ctx = tmp_path / "ctx"
    (ctx / "zoo").mkdir(parents=True)
    (ctx / "zoo" / "model.py").write_text(f"TOKEN = {token!r}\n")
    monkeypatch.chdir(ctx)
    repo = f"{docker_env.registry}/elasticdl-test/push-{token}"
    image = f"{repo}:v1"
    client = docker_env.client()
    assert (
        _cli(capsys, "zoo", "init", f"--base_image={docker_env.base_image}", "--model_zoo=zoo")[0]
        == 0
    )
    rc, _, err = _cli(capsys, "zoo", "build", f"--image={image}", ".")
    assert rc == 0, err
    try:
        rc, out, err = _cli(capsys, "zoo", "push", image)
        assert rc == 0, err
        digest = out.strip()
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), out
        assert re.search(
            r"pushed .*:v1 in [0-9.]+s \(\d+ layers uploaded, \d+ already there\)", err
        ), err
        assert (
            f"elasticdl-test/push-{token}" in _registry_json("/v2/_catalog?n=1000")["repositories"]
        )
        assert _registry_json(f"/v2/elasticdl-test/push-{token}/tags/list")["tags"] == ["v1"]

        # Gone locally, pulled back from the registry: the same content.
        client.remove_image(image, force=True)
        client.pull(repo, tag="v1")
        assert digest in " ".join(client.inspect_image(image)["RepoDigests"])
        assert _run(client, image, "import model; print(model.TOKEN)").strip() == token
    finally:
        try:
            client.remove_image(image, force=True)
        except Exception:
            pass


@pytest.mark.parametrize(
    "dockerfile, needles",
    [
        ("FROM 127.0.0.1:5000/elasticdl-test/no-such-base:v0\n", ["no-such-base", "step 1/1"]),
        ("FROMM local/base\n", ["unknown instruction", "FROMM"]),
        (
            "FROM local/base\nRUN echo compiling && exit 3\n",
            ["step 2/2 (RUN echo compiling", "returned a non-zero code: 3"],
        ),
    ],
    ids=["missing-base-image", "bad-dockerfile", "failing-run"],
)
def test_build_errors_are_one_line(docker_env, tmp_path, monkeypatch, capsys, dockerfile, needles):
    (tmp_path / "Dockerfile").write_text(dockerfile)
    monkeypatch.chdir(tmp_path)
    rc, out, err = _cli(capsys, "zoo", "build", "--image=elasticdl-test/broken:v1", ".")
    assert out == ""
    _assert_one_error_line(rc, err, "building elasticdl-test/broken:v1 failed", *needles)


def test_push_of_missing_image_is_one_line(docker_env, capsys):
    rc, out, err = _cli(
        capsys, "zoo", "push", f"{docker_env.registry}/elasticdl-test/never-built:v9"
    )
    assert out == ""
    _assert_one_error_line(rc, err, "pushing 127.0.0.1:5000/elasticdl-test/never-built:v9 failed")
