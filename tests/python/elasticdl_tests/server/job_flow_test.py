"""The job server's whole flow with real parts: a server process (uvicorn on 127.0.0.1), the
`elasticdl` CLI configured with its URL and a token, real Fashion-MNIST shards uploaded, and
a real local training job (master, PS, worker processes) started by the server.

The server is SIGKILLed while the job trains: the job goes on, and a new server on the same
state directory lists it, streams its logs and sees it succeed. A second user sees none of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import elasticdl
import mnist.mnist_functional_api  # noqa: F401  (locates the model zoo; a build dependency)
import pytest
from elasticdl.jobs.errors import JobConflictError, JobNotFoundError
from elasticdl.jobs.local_processes import pid_alive
from elasticdl.jobs.server_client import JobServerClient
from elasticdl_testing.cli import run_cli
from elasticdl_testing.server_process import ServerProcess

MODEL_DEF = "mnist.mnist_functional_api.custom_model"
MODEL_ZOO = str(Path(mnist.mnist_functional_api.__file__).resolve().parent.parent)
SRC = str(Path(elasticdl.__file__).resolve().parent.parent)


def data_cache() -> Path:
    default = Path.home() / ".cache" / "elasticdl" / "e2e" / "fashion_mnist"
    return Path(os.environ.get("ELASTICDL_E2E_DATA") or default)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """One training shard (4,096 records) and one test shard: a job of ~64 steps."""
    from elasticdl.data.datasets import prepare

    prepare("fashion_mnist", str(data_cache()), progress=False)
    root = tmp_path_factory.mktemp("shards")
    for split in ("train", "test"):
        (root / split).mkdir()
        first = sorted(n for n in os.listdir(data_cache() / split) if not n.startswith("."))[0]
        (root / split / first).symlink_to(data_cache() / split / first)
    return root


class Cli:
    """`python -m elasticdl.client` with a config file naming the server and a user's token."""

    def __init__(self, home: Path, server: ServerProcess, token: str) -> None:
        self.home, self.server, self.token = home, server, token
        self.env = dict(os.environ)
        self.env["ELASTICDL_HOME"] = str(home)
        self.env["ELASTICDL_CONFIG"] = str(home / "config.yaml")
        self.env["PYTHONPATH"] = os.pathsep.join(
            [SRC] + ([self.env["PYTHONPATH"]] if self.env.get("PYTHONPATH") else [])
        )
        home.mkdir(parents=True, exist_ok=True)
        self.configure()

    def configure(self) -> None:
        """(Again after a restart: the new server listens on another port.)"""
        (self.home / "config.yaml").write_text(
            f"server:\n  url: {self.server.url}\n  token: {self.token}\n"
        )

    def run(
        self, *args: str, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess:
        return run_cli(
            args,
            self.home,
            self.env,
            timeout,
            check,
            diagnose=lambda: f"\nserver log:\n{self.server.log()[-3000:]}",
        )


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = dict(os.environ)
    env.pop("ELASTICDL_MASTER_PEX", None)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    server = ServerProcess(tmp_path_factory.mktemp("srv") / "state", env)
    server.tokens = {u: server.add_user(u) for u in ("alice", "bob")}
    server.start()
    yield server
    # Jobs the test left running (a failure half-way) are cancelled, then the server stops.
    for user in server.tokens:
        try:
            sdk = JobServerClient(server.url, server.tokens[user])
            for job in sdk.list_jobs():
                if not job.is_final:
                    sdk.stop_job(job.job_name)
        except Exception:  # noqa: BLE001 - the server may be the thing that failed
            pass
    server.stop()


@pytest.fixture(scope="module")
def alice(server, tmp_path_factory):
    return Cli(tmp_path_factory.mktemp("alice"), server, server.tokens["alice"])


def sdk(server, user):
    return JobServerClient(server.url, server.tokens[user])


def wait_for(server, user, job, predicate, timeout, what):
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        status = sdk(server, user).get_job_status(job)
        if predicate(status):
            return status
        if status.is_final:
            break
        time.sleep(0.5)
    log = "".join(sdk(server, user).tail_logs(job))
    raise AssertionError(
        f"job {job} never {what}; last status {status}\nmaster log:\n{log[-3000:]}"
    )


def test_upload_train_kill_the_server_and_finish(server, alice, shards, tmp_path):
    up = alice.run("upload", str(shards / "train"), "fashion_mnist/train")
    assert "100%" in up.stderr and "uploaded 1 file(s)" in up.stderr
    alice.run("upload", str(shards / "test"), "fashion_mnist/test")
    assert "server 0." in alice.run("version").stdout

    alice.run(
        "train",
        "--job_name=srv-mnist",
        f"--package_path={MODEL_ZOO}",
        f"--model_def={MODEL_DEF}",
        "--training_data=fashion_mnist/train",
        "--validation_data=fashion_mnist/test",
        "--num_epochs=1",
        "--minibatch_size=64",
        "--num_minibatches_per_task=4",
        "--num_workers=1",
        "--num_ps_pods=1",
        "--checkpoint_steps=32",
        "--checkpoint_dir=checkpoints/srv-mnist",
        "--detach",
    )
    listed = alice.run("list").stdout
    assert "srv-mnist" in listed

    # Another user sees nothing of it, cannot cancel it, and cannot take its name.
    bob = sdk(server, "bob")
    assert bob.list_jobs() == []
    with pytest.raises(JobNotFoundError, match="no job named 'srv-mnist'"):
        bob.get_job_status("srv-mnist")
    with pytest.raises(JobNotFoundError):
        bob.stop_job("srv-mnist")
    package = sdk(server, "alice").upload_package(MODEL_ZOO)
    spec = {"job_name": "srv-mnist", "model_def": MODEL_DEF, "training_data": "x"}
    (server.state_dir / "data" / "bob" / "x").mkdir(parents=True)
    # (A package is each uploader's own: bob sends the same zoo and gets the same id.)
    assert bob.upload_package(MODEL_ZOO) == package
    with pytest.raises(JobConflictError, match="job name 'srv-mnist' is taken"):
        bob.submit_job(spec, package_id=package)
    # Nor can its owner start a second job of that name while it runs.
    with pytest.raises(JobConflictError, match="still running"):
        sdk(server, "alice").submit_job(
            dict(spec, training_data="fashion_mnist/train"), package_id=package
        )

    running = wait_for(
        server, "alice", "srv-mnist", lambda s: s.records_trained > 0, 180, "trained a task"
    )
    server.kill()  # SIGKILL: the job's processes are not the server's to take down
    assert pid_alive(running.master["pid"])
    server.start()
    alice.configure()

    shown = json.loads(alice.run("status", "srv-mnist", "-o", "json").stdout)
    assert shown["job_name"] == "srv-mnist" and shown["phase"] in ("Running", "Succeeded")
    assert alice.run("wait", "srv-mnist", "--timeout=240", timeout=300).returncode == 0
    final = sdk(server, "alice").get_job_status("srv-mnist")
    assert final.phase == "Succeeded" and final.records_trained == final.records_expected == 4096
    assert "accuracy" in final.evaluation_metrics
    log = alice.run("logs", "srv-mnist").stdout
    assert "Evaluation metrics" in log
    assert alice.run("logs", "srv-mnist", "--replica", "worker-0").stdout
    assert "srv-mnist" in alice.run("list").stdout
    assert sdk(server, "bob").list_jobs() == []

    # The job wrote its checkpoints into alice's data directory: download them.
    got = alice.run("download", "checkpoints/srv-mnist", str(tmp_path / "ckpt"))
    assert "downloaded" in got.stderr
    assert list((tmp_path / "ckpt").rglob("*.ckpt")), list((tmp_path / "ckpt").rglob("*"))


def test_cancel_a_running_job(server, alice, shards):
    alice.run("upload", str(shards / "train"), "fashion_mnist/train")  # again: runs alone too
    alice.run(
        "train",
        "--job_name=srv-cancel",
        f"--package_path={MODEL_ZOO}",
        f"--model_def={MODEL_DEF}",
        "--training_data=fashion_mnist/train",
        "--num_epochs=100",
        "--minibatch_size=64",
        "--num_workers=1",
        "--num_ps_pods=1",
        "--detach",
    )
    running = wait_for(
        server, "alice", "srv-cancel", lambda s: s.phase == "Running" and s.master, 180, "ran"
    )
    with pytest.raises(JobNotFoundError):
        sdk(server, "bob").stop_job("srv-cancel")
    # A follower of the master's log streams until the job has ended.
    followed: list[str] = []
    follower = threading.Thread(
        target=lambda: followed.extend(sdk(server, "alice").tail_logs("srv-cancel", follow=True))
    )
    follower.start()
    assert sdk(server, "alice").get_job_status("srv-cancel").phase == "Running"
    cancelled = alice.run("cancel", "srv-cancel", timeout=120)
    assert "Cancelled" in cancelled.stderr
    assert sdk(server, "alice").get_job_status("srv-cancel").phase == "Cancelled"
    assert not pid_alive(running.master["pid"])
    follower.join(timeout=60)
    assert not follower.is_alive(), "the followed log did not end with the job"
    assert "Launched worker-0" in "".join(followed)
