"""End-to-end fixtures: real Fashion-MNIST data and real jobs run through the `elasticdl` CLI.

Every job runs as real processes (client -> master -> PS and workers on 127.0.0.1) in a
private ``$ELASTICDL_HOME``, with this interpreter (no PEX, no Kubernetes). The data is prepared
once per machine by ``elasticdl.data.datasets.prepare`` into ``~/.cache/elasticdl/e2e``
(``$ELASTICDL_E2E_DATA`` overrides); smaller jobs read a few of its shard files.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import elasticdl
import mnist.mnist_functional_api  # noqa: F401  (locates the model zoo; a build dependency)
import pytest
from elasticdl_testing.cli import run_cli

MODEL_DEF = "mnist.mnist_functional_api.custom_model"
MODEL_ZOO = str(Path(mnist.mnist_functional_api.__file__).resolve().parent.parent)
SRC = str(Path(elasticdl.__file__).resolve().parent.parent)
TERMINAL = ("Succeeded", "Failed", "Cancelled")


def data_cache() -> Path:
    default = Path.home() / ".cache" / "elasticdl" / "e2e" / "fashion_mnist"
    return Path(os.environ.get("ELASTICDL_E2E_DATA") or default)


@pytest.fixture(scope="session")
def fashion_mnist() -> Path:
    """The full prepared dataset: train/ (60,000 records) and test/ (10,000)."""
    from elasticdl.data.datasets import prepare

    out = data_cache()
    prepare("fashion_mnist", str(out), progress=False)
    return out


@pytest.fixture(scope="session")
def small_data(fashion_mnist, tmp_path_factory) -> dict:
    """Subsets for the shorter jobs: 4 training files (16,384 records), 1 test file (4,096)."""
    root = tmp_path_factory.mktemp("small-data")
    out = {}
    for split, count in (("train", 4), ("test", 1)):
        d = root / split
        d.mkdir()
        names = sorted(n for n in os.listdir(fashion_mnist / split) if not n.startswith("."))
        for name in names[:count]:
            (d / name).symlink_to(fashion_mnist / split / name)
        out[split] = d
    return out


class Cli:
    """Runs `python -m elasticdl.client ...` with a private ELASTICDL_HOME."""

    def __init__(self, home: Path, workdir: Path):
        self.home = home
        self.workdir = workdir  # no dist/master.pex here: the master runs with this interpreter
        env = dict(os.environ)
        env.pop("ELASTICDL_MASTER_PEX", None)
        env["ELASTICDL_HOME"] = str(home)
        env["PYTHONPATH"] = os.pathsep.join(
            [SRC, MODEL_ZOO] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
        env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        self.env = env
        self._jobs: list[str] = []

    def run(
        self, *args: str, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess:
        return run_cli(args, self.workdir, self.env, timeout, check)

    def submit(self, command: str, job: str, *flags: str) -> None:
        self._jobs.append(job)
        self.run(
            command,
            f"--job_name={job}",
            "--platform=local",
            f"--model_zoo={MODEL_ZOO}",
            f"--model_def={MODEL_DEF}",
            "--detach",
            *flags,
        )

    def job_dir(self, job: str) -> Path:
        return self.home / "jobs" / job

    def status(self, job: str, timeout: float = 5.0) -> dict:
        """status.json as the master wrote it (pids, job dir and all)."""
        path = self.job_dir(job) / "status.json"
        deadline = time.monotonic() + timeout
        while True:
            try:
                return json.loads(path.read_text())
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    raise AssertionError(f"{path} is missing or unreadable") from None
                time.sleep(0.25)

    def wait_for(self, job: str, predicate, timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        status = self.status(job, timeout=120)  # the master starts (imports TensorFlow) first
        while time.monotonic() < deadline:
            status = self.status(job)
            if predicate(status):
                return status
            if status.get("phase") in TERMINAL:
                break
            time.sleep(0.3)
        raise AssertionError(
            f"job {job}: never {what}; last status:\n{json.dumps(status, indent=1)[-4000:]}\n"
            f"master log tail:\n{self.master_log(job)[-3000:]}"
        )

    def wait_end(self, job: str, timeout: float) -> dict:
        self.run("wait", job, f"--timeout={int(timeout)}", timeout=timeout + 30, check=False)
        # The master writes its final status before it exits; `wait` returns once it exited.
        return self.status(job)

    def master_log(self, job: str) -> str:
        try:
            return (self.job_dir(job) / "logs" / "master.log").read_text()
        except OSError:
            return ""

    def replica_log(self, job: str, replica: str) -> str:
        return (self.job_dir(job) / "logs" / f"{replica}.log").read_text()

    def cleanup(self) -> None:
        for job in self._jobs:
            try:
                phase = self.status(job).get("phase")
            except AssertionError:
                continue
            if phase not in TERMINAL:
                self.run("cancel", job, timeout=120, check=False)


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    c = Cli(tmp_path_factory.mktemp("elasticdl-home"), tmp_path_factory.mktemp("cwd"))
    yield c
    c.cleanup()


def replica(status: dict, name: str) -> dict:
    matches = [r for r in status["replicas"] if r["name"] == name]
    assert matches, f"no replica {name} in {[r['name'] for r in status['replicas']]}"
    return matches[-1]


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
