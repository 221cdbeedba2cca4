"""elasticdl.api and the CLI with a job server in the config file: jobs, data and versions go
through the server. The jobs' master is the client tests' FAKE master (ends in ~0.5 s; the
real one is in tests/python/elasticdl_tests/server); the server and its submit path are real."""

from pathlib import Path

import elasticdl
import pytest
from elasticdl import api
from elasticdl.client.main import main
from elasticdl.jobs.server_client import JobServerClient
from elasticdl_testing.server_process import ServerProcess

FAKE_MASTER = Path(elasticdl.__file__).parent / "jobs" / "testdata" / "fake_master.py"


@pytest.fixture
def configured(tmp_path, monkeypatch):
    import os

    env = dict(os.environ, ELASTICDL_MASTER_PEX=str(FAKE_MASTER), FAKE_MASTER_STEPS="2")
    server = ServerProcess(tmp_path / "state", env)
    token = server.add_user("alice")
    server.start()
    config = tmp_path / "config.yaml"
    config.write_text(f"server:\n  url: {server.url}\n  token: {token}\n")
    monkeypatch.setenv("ELASTICDL_CONFIG", str(config))
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path / "home"))
    zoo = tmp_path / "zoo"
    (zoo / "mnist").mkdir(parents=True)
    (zoo / "mnist" / "model.py").write_text("def custom_model():\n    pass\n")
    yield server, zoo, tmp_path
    server.stop()


def test_api_goes_through_the_server(configured):
    server, zoo, tmp = configured
    assert api.server_version()["user"] == "alice"
    (tmp / "train").mkdir()
    (tmp / "train" / "part-0").write_bytes(b"records")
    seen = []
    api.upload(str(tmp / "train"), "d/train", progress=lambda *a: seen.append(a))
    assert seen[-1][:2] == (7, 7)
    handle = api.train(
        job_name="via-api",
        package_path=str(zoo),
        model_def="mnist.model.custom_model",
        training_data="d/train",
    )
    assert handle.job_name == "via-api" and handle.platform == "server:local"
    final = api.wait("via-api", timeout=60, poll_interval=0.2)
    assert final.phase == "Succeeded"
    assert [j.job_name for j in api.list_jobs()] == ["via-api"]
    log = "".join(api.logs("via-api"))
    assert "fake master of via-api" in log
    # tail=N: the log's last N lines only (what the dashboard polls).
    token = (tmp / "config.yaml").read_text().split("token: ")[1].strip()
    client = JobServerClient(server.url, token)
    assert "".join(client.tail_logs("via-api", tail=2)) == "".join(log.splitlines(True)[-2:])
    # The job ran on the server, from the package, on the uploaded data.
    spec = (server.state_dir / "jobs" / "alice" / "via-api" / "job_spec.json").read_text()
    assert str(server.state_dir / "data" / "alice" / "d" / "train") in spec
    assert str(server.state_dir / "packages") in spec
    api.download("d/train", str(tmp / "back"))
    assert (tmp / "back" / "part-0").read_bytes() == b"records"
    with pytest.raises(api.JobNotFoundError):
        api.status("nothing")


def test_cli_version_and_bad_package_path(configured, capsys):
    server, zoo, tmp = configured
    assert main(["version"]) == 0
    assert f"server 0.3.0 at {server.url}" in capsys.readouterr().out
    code = main(["train", "--job_name=x", "--package_path=/nonexistent", "--model_def=a.b"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--package_path '/nonexistent' is not a directory" in err and err.count("\n") == 1
    # --platform=local bypasses the server (a local job, nothing on the server).
    assert main(["list", "--platform=local"]) == 0
    assert "no jobs found" in capsys.readouterr().err


def test_submit_goes_to_the_configured_server_like_train(configured):
    """api.submit(spec) decides where the job goes as api.train does: the job server."""
    server, zoo, tmp = configured
    (tmp / "train").mkdir()
    (tmp / "train" / "part-0").write_bytes(b"records")
    api.upload(str(tmp / "train"), "d/train")
    spec = api.JobSpec(
        job_name="via-submit",
        model_zoo=str(zoo),
        model_def="mnist.model.custom_model",
        training_data="d/train",
    )
    handle = api.submit(spec)
    assert (handle.platform, handle.server) == ("server:local", server.url)
    assert api.wait(handle, timeout=60, poll_interval=0.2).phase == "Succeeded"
    assert (server.state_dir / "jobs" / "alice" / "via-submit" / "job_spec.json").is_file()
    assert not (tmp / "home" / "jobs").exists()  # nothing ran on this machine
