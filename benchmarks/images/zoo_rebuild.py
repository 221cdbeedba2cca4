"""`elasticdl zoo build` after a model edit (the dependency layers come from the engine's
cache) against the cold build of the same model zoo (nothing cached), in one run.

    python benchmarks/images/zoo_rebuild.py       # [--repeats 5] [--base_image IMAGE]

Needs a real engine: $DOCKER_HOST, else the project's own (scripts/container-engine/
setup-dockerd.sh; root), whose local/base is the default base image. Each round makes a model
zoo with fresh content (a random token, so no earlier build's cache can serve it) holding a
model file and a requirement served from --local_pkg_dir (a tiny wheel), runs `zoo init`, then
times the cold `zoo build` and, after editing only the model file, the rebuild; both images
are removed. The table shows the medians, the ratio rebuild / cold build and the load average
before and after; the last line is JSON. This was a test's "the second build is faster than
the first"; the test now asserts that the rebuild reuses every layer below the model code.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import uuid
import zipfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parents[1]
for _path in (_HERE.parent, _ROOT / "src" / "python"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from elasticdl.client import zoo  # noqa: E402,F401  (main runs it by name)
from elasticdl.client.main import main as cli  # noqa: E402
from interleaved import interleaved, load_average, print_summary, summary  # noqa: E402


def _wheel(directory: Path, token: str) -> None:
    """zoo_helper 1.0, a pure-Python wheel whose content is TOKEN."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "zoo_helper/__init__.py": f"TOKEN = {token!r}\n".encode(),
        "zoo_helper-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: zoo-helper\nVersion: 1.0\n",
        "zoo_helper-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    with zipfile.ZipFile(directory / "zoo_helper-1.0-py3-none-any.whl", "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        zf.writestr(
            "zoo_helper-1.0.dist-info/RECORD",
            "\n".join(record + ["zoo_helper-1.0.dist-info/RECORD,,"]) + "\n",
        )


def _run_cli(*argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli(list(argv))
    if rc != 0:
        raise SystemExit(f"elasticdl {' '.join(argv)} failed ({rc}): {err.getvalue()[-2000:]}")
    return out.getvalue().strip()


def _docker_host() -> str:
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    done = subprocess.run(
        ["bash", str(_ROOT / "scripts" / "container-engine" / "setup-dockerd.sh")],
        capture_output=True,
        text=True,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("DOCKER_HOST=")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"no engine: set DOCKER_HOST or run as root ({done.stderr[-500:]})")
    return lines[-1].split("=", 1)[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--base_image", default="local/base:latest")
    args = p.parse_args(argv)
    os.environ["DOCKER_HOST"] = _docker_host()
    import docker

    client = docker.APIClient(base_url=os.environ["DOCKER_HOST"], version="auto")
    load_before = load_average()
    state: dict = {}
    here = os.getcwd()

    def before_each(name: str) -> None:
        if name == "cold build":  # a new model zoo: nothing of it is in the cache
            token = uuid.uuid4().hex
            ctx = Path(state["tmp"]) / token
            (ctx / "model_zoo" / "mnist").mkdir(parents=True)
            (ctx / "model_zoo" / "mnist" / "__init__.py").write_text("")
            (ctx / "model_zoo" / "mnist" / "model.py").write_text("VERSION = 1\n")
            (ctx / "model_zoo" / "requirements.txt").write_text(f"zoo-helper==1.0  # {token}\n")
            _wheel(ctx / "pkgs", token)
            os.chdir(ctx)
            _run_cli(
                "zoo",
                "init",
                f"--base_image={args.base_image}",
                "--model_zoo=model_zoo",
                "--local_pkg_dir=pkgs",
            )
            state["image"] = f"elasticdl-bench/zoo-{token[:12]}:v1"
        else:  # only the model file changes
            Path("model_zoo/mnist/model.py").write_text("VERSION = 2\n")

    def build() -> None:
        state.setdefault("ids", []).append(
            _run_cli("zoo", "build", f"--image={state['image']}", ".")
        )

    with tempfile.TemporaryDirectory() as tmp:
        state["tmp"] = tmp
        try:
            seconds = interleaved(
                {"cold build": build, "rebuild after a model edit": build},
                args.repeats,
                before_each=before_each,
            )
        finally:
            os.chdir(here)
            for image in state.get("ids", []):
                with contextlib.suppress(Exception):
                    client.remove_image(image, force=True)
    result = summary(
        "zoo_rebuild",
        seconds,
        ("rebuild after a model edit", "cold build"),
        load_before,
        base_image=args.base_image,
    )
    print_summary(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
