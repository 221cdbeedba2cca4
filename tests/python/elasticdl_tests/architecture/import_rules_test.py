"""The import rules of docs/architecture.md hold, and a module that breaks one is caught.

import-linter (a real checker from PyPI) reads ``import_rules.ini`` and checks it over a copy of
the library's modules: the tests beside the code and their test data may import what they
need, so they are left out of the copy. The library comes from $ELASTICDL_SOURCE_ROOT when CI
names the checkout (every package, whatever this test's build inputs hold), else from where
``elasticdl`` is imported.
"""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import elasticdl
import elasticdl_testing
import pytest

RULES = Path(__file__).with_name("import_rules.ini")
# Every package the rules name, and the rest of the library they keep in check.
PACKAGES = (
    "common",
    "common/job_spec",
    "master",
    "ps",
    "worker",
    "platform",
    "data",
    "data/reader",
    "data/datasets",
    "ops",
    "k8s",
    "jobs",
    "client",
    "server",
    "images",
    "python",
)
CONTRACTS = (
    "common imports nothing above it",
    "master, PS and worker never import each other",
    "the master drives the platform; replicas, readers and kernels never reach up",
    "nothing in the library imports test support",
    "the CLI and the server use jobs through the SDK, not each other",
)


def _library_root() -> Path:
    checkout = os.environ.get("ELASTICDL_SOURCE_ROOT", "")
    if checkout and (Path(checkout) / "src" / "python" / "elasticdl").is_dir():
        return Path(checkout) / "src" / "python" / "elasticdl"
    return Path(elasticdl.__file__).parent


def _is_library_module(path: Path) -> bool:
    if "testdata" in path.parts or "__pycache__" in path.parts:
        return False
    return path.suffix == ".py" and not path.stem.endswith("_test") and path.stem != "conftest"


def _copy_package(source: Path, target: Path) -> None:
    for path in source.rglob("*.py"):
        rel = path.relative_to(source)
        if _is_library_module(rel):
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target / rel)


@pytest.fixture
def tree(tmp_path) -> Path:
    _copy_package(_library_root(), tmp_path / "elasticdl")
    _copy_package(Path(elasticdl_testing.__file__).parent, tmp_path / "elasticdl_testing")
    for package in PACKAGES:
        assert (tmp_path / "elasticdl" / package / "__init__.py").is_file(), f"{package} is missing"
    return tmp_path


def _lint(tree: Path) -> subprocess.CompletedProcess:
    code = (
        "import sys; from importlinter.cli import lint_imports; "
        f"sys.exit(lint_imports(config_filename={str(RULES)!r}, no_cache=True, no_logo=True))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PEX_EXTRA_SYS_PATH")}
    env["PYTHONPATH"] = str(tree)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_library_keeps_its_import_rules(tree):
    done = _lint(tree)
    assert done.returncode == 0, done.stdout + done.stderr
    print(done.stdout)
    for contract in CONTRACTS:
        assert f"{contract} KEPT" in done.stdout, done.stdout


def test_a_module_that_breaks_a_rule_is_named_with_its_import(tree):
    bad = {
        "elasticdl/common/reaches_up.py": "from elasticdl.master import task_manager\n",
        "elasticdl/worker/asks_the_master.py": "import elasticdl.master.rendezvous\n",
        "elasticdl/ps/uses_a_harness.py": (
            "def helper():\n    from elasticdl_testing import tmpfs\n\n    return tmpfs\n"
        ),
        "elasticdl/server/asks_the_cli.py": "from elasticdl.client import job_commands\n",
    }
    for name, text in bad.items():
        (tree / name).write_text(textwrap.dedent(text))
    done = _lint(tree)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    for contract in (CONTRACTS[0], CONTRACTS[1], CONTRACTS[3], CONTRACTS[4]):
        assert f"{contract} BROKEN" in out, out
    assert "elasticdl.common.reaches_up -> elasticdl.master.task_manager" in out, out
    assert "elasticdl.worker.asks_the_master -> elasticdl.master.rendezvous" in out, out
    assert "elasticdl.ps.uses_a_harness -> elasticdl_testing.tmpfs" in out, out
    assert "elasticdl.server.asks_the_cli -> elasticdl.client.job_commands" in out, out
