"""The CPU base image (deploy/docker/Dockerfile.cpu) built from the project's wheels with
deploy/docker/build-images.sh on a REAL engine, then a container that imports the framework
and runs a native kernel, and a model-zoo image built on top of it with `zoo build`.

Wheels: $ELASTICDL_WHEEL_DIR or dist/ (`./pants package ::`) when they hold elasticdl-*.whl;
else built from the source tree -- this checkout, or $ELASTICDL_SOURCE_ROOT under Pants --
(dev wheel of src/python + dist's elasticdl_native wheel or `pip wheel src/cc`, 1-2 min of
C++ compile); else skipped with the reason. The container gets no TensorFlow (TENSORFLOW=""):
CI machines cannot afford a ~600 MB download per run, and TensorFlow is not what this image
test checks; numpy is downloaded on the host and installed offline (--no-index --no-deps).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from elasticdl.client import (  # noqa: F401  (main imports it by name; this makes it a dependency)
    zoo,
)
from elasticdl.client.main import main
from elasticdl_tests.images.engine import repo_root


def _wheel_source(root: Path) -> tuple[Path, list[str]]:
    """(checkout whose build-images.sh runs, its wheel flags)."""
    checkouts = [root] + [Path(p) for p in [os.environ.get("ELASTICDL_SOURCE_ROOT", "")] if p]
    for d in [os.environ.get("ELASTICDL_WHEEL_DIR", "")] + [str(c / "dist") for c in checkouts]:
        if d and list(Path(d).glob("elasticdl-[0-9]*.whl")):
            return root, ["--dist", d]
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


def _run(client, image: str, code: str) -> str:
    c = client.create_container(image, command=["python3", "-c", code])
    try:
        client.start(c)
        status = client.wait(c, timeout=120)
        logs = client.logs(c).decode()
        assert status["StatusCode"] == 0, logs
        return logs
    finally:
        client.remove_container(c, force=True)


def test_cpu_base_image_from_wheels_runs_framework_and_kernels(
    docker_env, tmp_path, monkeypatch, capsys
):
    root, source = _wheel_source(repo_root())
    token = uuid.uuid4().hex[:12]
    base = f"elasticdl-test/base-cpu:{token}"
    zoo_image = f"elasticdl-test/zoo-on-base:{token}"
    client = docker_env.client()
    t0 = time.monotonic()
    r = subprocess.run(
        [
            "bash",
            str(root / "deploy" / "docker" / "build-images.sh"),
            "cpu",
            *source,
            "--tag",
            base,
            "--base-image",
            docker_env.base_image,
            "--tensorflow",
            "",
            "--pip-options",
            "--no-index --no-deps",
            "--wheel",
            "numpy==1.26.4",
        ],
        capture_output=True,
        text=True,
        timeout=840,
        env={**os.environ, "DOCKER_HOST": docker_env.docker_host, "PYTHON": _python_with_pip()},
    )
    build_s = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    try:
        out = _run(
            client,
            base,
            "import numpy as np, elasticdl, elasticdl.ops as ops, elasticdl_native\n"
            "p = np.ones(4, np.float32); ops.sgd(p, np.full(4, 0.5, np.float32), 0.1)\n"
            "print(ops.backend(), *p.tolist())",
        ).split()
        assert out[0] == "native"
        assert [float(x) for x in out[1:]] == pytest.approx([0.95] * 4)
        assert (
            _run(client, base, "import os; print(os.path.exists('/tmp/wheels'))").strip() == "False"
        )

        # A model zoo on top of it: `zoo init` + `zoo build`, the model sees the framework.
        ctx = tmp_path / "ctx"
        (ctx / "zoo" / "m").mkdir(parents=True)
        (ctx / "zoo" / "m" / "__init__.py").write_text(
            "import elasticdl.ops as ops\nBACKEND = ops.backend()\n"
        )
        monkeypatch.chdir(ctx)
        assert main(["zoo", "init", f"--base_image={base}", "--model_zoo=zoo"]) == 0
        assert main(["zoo", "build", f"--image={zoo_image}", "."]) == 0, capsys.readouterr().err
        assert _run(client, zoo_image, "import m; print(m.BACKEND)").strip() == "native"
        with capsys.disabled():
            print(f"\nCPU base image ({' '.join(source)}): built in {build_s:.1f}s")
    finally:
        for img in (zoo_image, base):
            try:
                client.remove_image(img, force=True)
            except Exception:  # not built
                pass
