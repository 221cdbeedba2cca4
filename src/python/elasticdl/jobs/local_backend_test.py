"""LocalBackend end to end, through the real CLI, with a FAKE master.

The real master needs TensorFlow and takes far too long for a client test, so the master
runtime is ``testdata/fake_master.py`` (selected through $ELASTICDL_MASTER_PEX, exactly as a
user points the client at a master.pex). Everything else is real: detached process groups,
the job directory, status/log files, signals.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from elasticdl.client.main import main
from elasticdl.common.job_spec import JobSpec
from elasticdl.jobs.errors import JobConflictError, JobNotFoundError, WaitTimeout
from elasticdl.jobs.local_backend import LocalBackend
from elasticdl.jobs.local_processes import pid_alive

FAKE_MASTER = Path(__file__).parent / "testdata" / "fake_master.py"


@pytest.fixture
def env(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("ELASTICDL_HOME", str(home))
    monkeypatch.setenv("ELASTICDL_MASTER_PEX", str(FAKE_MASTER))
    monkeypatch.delenv("ELASTICDL_CONFIG", raising=False)
    monkeypatch.setenv("FAKE_MASTER_STEPS", "3")
    zoo = tmp_path / "zoo" / "mnist"
    zoo.mkdir(parents=True)
    (zoo / "model.py").write_text("def custom_model(): pass\n")
    data = tmp_path / "data"
    data.mkdir()
    (data / "shard-0.rio").write_bytes(b"")  # a RecordIO shard without records
    monkeypatch.chdir(tmp_path)
    return home


def _sent_spec(job_dir) -> JobSpec:
    return JobSpec.from_json((job_dir / "job_spec.json").read_text())


def job_argv(name="job-a", *extra):
    return [
        "train",
        f"--job_name={name}",
        "--model_zoo=zoo",
        "--model_def=mnist.model.custom_model",
        "--training_data=data",
        *extra,
    ]


def test_train_follows_the_job_and_returns_its_status(env, capsys):
    assert main(job_argv()) == 0
    out, err = capsys.readouterr()
    assert "fake master of job-a starting" in out and "job succeeded" in out
    assert "platform: local" in err and "num_ps_pods: 1" in err
    assert "job job-a Succeeded" in err
    job_dir = env / "jobs" / "job-a"
    job = json.loads((job_dir / "job.json").read_text())
    assert job["platform"] == "local" and not pid_alive(job["pid"])
    argv = json.loads((job_dir / "argv.json").read_text())
    assert argv == [f"--job_spec_file={job_dir / 'job_spec.json'}"]
    sent = _sent_spec(job_dir)
    assert (job_dir / "job_spec.json").stat().st_mode & 0o777 == 0o600  # may hold --envs
    assert sent.job_dir == str(job_dir) and sent.platform == "local"
    assert sent.num_ps_pods == 1 and sent.job_type == "training_only"
    assert sent.model_zoo == str(env.parent / "zoo")  # made absolute for the master


def test_failed_job_exits_1(env, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_MASTER_MODE", "fail")
    assert main(job_argv()) == 1
    assert "job job-a Failed: worker-0 failed" in capsys.readouterr().err


def test_the_masters_error_line_is_shown_once(env, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_MASTER_MODE", "fail_with_error_line")
    assert main(job_argv()) == 1
    out, err = capsys.readouterr()
    assert (out + err).count("worker-0 failed") == 1, out + err
    assert "job job-a Failed (the error above)" in err


def test_detach_then_status_list_logs_wait(env, capsys):
    assert main(job_argv("job-b", "--detach")) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "job-b"
    assert "elasticdl logs -f job-b" in err
    assert main(["wait", "job-b", "--timeout=30"]) == 0
    assert "job job-b Succeeded" in capsys.readouterr().err

    assert main(["status", "job-b"]) == 0
    out = capsys.readouterr().out
    assert "Phase:       Succeeded" in out and "Version:     30" in out and "worker-0" in out
    assert main(["status", "job-b", "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (
        data["phase"] == "Succeeded"
        and data["records_trained"] == 300
        and data["platform"] == "local"
    )
    assert main(["status", "job-b", "-o", "yaml"]) == 0
    assert "phase: Succeeded" in capsys.readouterr().out

    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "NAME",
        "PLATFORM",
        "PHASE",
        "AGE",
        "VERSION",
        "WORKERS",
        "PROGRESS",
    ]
    assert (
        lines[1].split()[:3] == ["job-b", "local", "Succeeded"] and lines[1].split()[-1] == "100%"
    )

    assert main(["logs", "job-b"]) == 0
    assert "step 3 version 30" in capsys.readouterr().out
    assert main(["logs", "job-b", "--replica", "worker-0"]) == 0
    assert capsys.readouterr().out == "worker-0 started\n"
    assert main(["logs", "job-b", "--replica", "worker-9"]) == 2
    assert "available: master, worker-0" in capsys.readouterr().err


def test_logs_follow_streams_until_the_end(env):
    backend = LocalBackend()
    main(job_argv("job-f", "--detach"))
    text = "".join(backend.logs("job-f", follow=True))
    assert text.startswith("fake master of job-f starting") and "job succeeded" in text
    assert backend.status("job-f").phase == "Succeeded"


def test_crashed_master_is_failed_with_its_exit_code(env, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MASTER_MODE", "crash")
    assert main(job_argv("job-c", "--detach")) == 0
    assert main(["wait", "job-c"]) == 1
    status = LocalBackend().status("job-c")
    assert status.phase == "Failed"
    assert (
        status.message
        == "master exited unexpectedly with code 3; last log line: fatal: something broke"
    )


def test_cancel_stops_the_process_group_and_a_rerun_replaces_the_job(env, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MASTER_MODE", "hang")
    assert main(job_argv("job-h", "--detach")) == 0
    backend = LocalBackend()
    deadline = time.time() + 20
    while backend.status("job-h").phase != "Running" and time.time() < deadline:
        time.sleep(0.05)
    assert backend.status("job-h").phase == "Running"
    # A second job with the same name is refused while the first runs; nothing is touched.
    assert main(job_argv("job-h", "--detach")) == 2
    assert "job 'job-h' is still running" in capsys.readouterr().err
    pid = json.loads((env / "jobs" / "job-h" / "job.json").read_text())["pid"]

    assert main(["cancel", "job-h"]) == 0
    assert "job job-h Cancelled" in capsys.readouterr().err
    assert not pid_alive(pid)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    assert "terminating" in "".join(backend.logs("job-h"))
    assert backend.wait("job-h", timeout=1).phase == "Cancelled"

    monkeypatch.setenv("FAKE_MASTER_MODE", "succeed")
    assert main(job_argv("job-h")) == 0
    assert backend.status("job-h").phase == "Succeeded"
    assert not (env / "jobs" / "job-h" / "cancelled").exists()


def test_cancel_waits_for_a_master_that_takes_time_to_stop(env, monkeypatch, caplog):
    """SIGTERM kills the wrapper shell at once; the master itself must still get its grace."""
    monkeypatch.setenv("FAKE_MASTER_MODE", "hang")
    monkeypatch.setenv("FAKE_MASTER_TERM_SECONDS", "1")
    main(job_argv("job-s", "--detach"))
    backend = LocalBackend(cancel_grace_seconds=20)
    deadline = time.time() + 20
    while backend.status("job-s").phase != "Running" and time.time() < deadline:
        time.sleep(0.05)
    assert backend.cancel("job-s").phase == "Cancelled"
    log = "".join(backend.logs("job-s"))
    assert log.rstrip().endswith("stopped cleanly")
    assert "killing it" not in caplog.text


def test_cancel_kills_a_master_ignoring_sigterm(env, monkeypatch):
    monkeypatch.setenv("FAKE_MASTER_MODE", "ignore_term")
    main(job_argv("job-i", "--detach"))
    backend = LocalBackend(cancel_grace_seconds=0.5)
    deadline = time.time() + 20
    while backend.status("job-i").phase != "Running" and time.time() < deadline:
        time.sleep(0.05)
    pid = json.loads((env / "jobs" / "job-i" / "job.json").read_text())["pid"]
    assert backend.cancel("job-i").phase == "Cancelled"
    time.sleep(0.1)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


def test_wait_timeout(env, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MASTER_MODE", "hang")
    main(job_argv("job-w", "--detach"))
    backend = LocalBackend()
    try:
        with pytest.raises(WaitTimeout, match="job job-w is still"):
            backend.wait("job-w", timeout=0.3, poll_interval=0.1)
        assert main(["wait", "job-w", "--timeout=0.2"]) == 1
        assert "elasticdl: error: job job-w is still" in capsys.readouterr().err
    finally:
        backend.cancel("job-w")


def test_custom_job_dir_is_found_by_name(env, tmp_path):
    custom = tmp_path / "my-job-dir"
    assert main(job_argv("job-d", f"--job_dir={custom}")) == 0
    assert (custom / "job.json").is_file()
    assert (env / "jobs" / "job-d").resolve() == custom
    assert [s.job_name for s in LocalBackend().list_jobs()] == ["job-d"]
    assert LocalBackend().status("job-d").job_dir == str(custom)


def test_job_dir_that_is_not_a_job_is_refused(env, tmp_path, capsys):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("keep me")
    assert main(job_argv("job-p", f"--job_dir={precious}")) == 2
    err = capsys.readouterr().err
    assert "was not created by ElasticDL" in err and len(err.strip().splitlines()) == 1
    assert (precious / "thesis.tex").read_text() == "keep me"


def test_job_dir_that_merely_holds_a_job_json_is_not_deleted(env, tmp_path, capsys):
    # Seen: a user's file went with such a directory when a job of that name was re-submitted.
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "job.json").write_text('{"job_name": "job-q"}')
    (precious / "thesis.tex").write_text("keep me")
    assert main(job_argv("job-q", f"--job_dir={precious}")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("elasticdl: error: --job_dir") and "not created by ElasticDL" in err
    assert "\n" not in err
    assert sorted(p.name for p in precious.iterdir()) == ["job.json", "thesis.tex"]
    assert not (env / "jobs" / "job-q").exists()


def test_rerun_removes_only_what_elasticdl_wrote(env, tmp_path, capsys):
    custom = tmp_path / "shared-dir"
    assert main(job_argv("job-r", f"--job_dir={custom}")) == 0
    assert (custom / ".elasticdl-job").is_file()
    (custom / "notes.txt").write_text("mine")  # the user adds a file to the job directory
    (custom / "logs" / "analysis").mkdir()
    (custom / "job_secret").write_text("previous job's")  # as the real master writes it
    assert main(job_argv("job-r", f"--job_dir={custom}")) == 0
    assert (custom / "notes.txt").read_text() == "mine"
    assert not (custom / "job_secret").exists()
    assert (custom / "job.json").is_file() and (custom / ".elasticdl-job").is_file()
    # The job moves back to the default place: the custom directory is left alone.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(job_argv("job-s", f"--job_dir={empty}")) == 0
    assert main(job_argv("job-s")) == 0
    assert (empty / "job.json").is_file()
    assert (env / "jobs" / "job-s" / "job.json").is_file()
    assert not (env / "jobs" / "job-s").is_symlink()


def test_default_job_dir_rerun_replaces_only_a_job_directory(env, capsys):
    assert main(job_argv("job-t")) == 0
    default = env / "jobs" / "job-t"
    # A job directory written before the marker existed: still replaced, and only its files.
    (default / ".elasticdl-job").unlink()
    (default / "mine.txt").write_text("keep")
    assert main(job_argv("job-t")) == 0
    assert (default / "mine.txt").read_text() == "keep"
    # A directory there whose job.json is not this job's: refused.
    (default / ".elasticdl-job").unlink()
    (default / "job.json").write_text('{"job_name": "other", "platform": "local"}')
    capsys.readouterr()
    assert main(job_argv("job-t")) == 2
    assert "not created by ElasticDL" in capsys.readouterr().err
    assert (default / "job.json").is_file() and (default / "mine.txt").is_file()


def test_a_job_that_does_not_start_leaves_no_directory(env, monkeypatch, capsys):
    def fail(*args, **kwargs):
        raise OSError("cannot fork")

    monkeypatch.setattr("elasticdl.jobs.local_backend.subprocess.Popen", fail)
    assert main(job_argv("job-u")) == 1
    assert "cannot fork" in capsys.readouterr().err
    assert not (env / "jobs" / "job-u").exists()


def test_validation_error_creates_nothing(env, capsys):
    assert main(job_argv("Bad_Name")) == 2
    err = capsys.readouterr().err
    assert err.startswith("elasticdl: error: --job_name 'Bad_Name' is invalid")
    assert len(err.strip().splitlines()) == 1
    assert not (env / "jobs").exists()


def test_unknown_job(env, capsys):
    assert main(["status", "nope"]) == 2
    assert "no local job named 'nope'" in capsys.readouterr().err
    with pytest.raises(JobNotFoundError):
        LocalBackend().cancel("nope")


def test_config_file_applies_and_flags_win(env, tmp_path, monkeypatch, capsys):
    config = tmp_path / "config.yaml"
    config.write_text("namespace: team-a\n")
    monkeypatch.setenv("ELASTICDL_CONFIG", str(config))
    assert main(job_argv("job-n")) == 0
    assert _sent_spec(env / "jobs" / "job-n").namespace == "team-a"
    assert main(job_argv("job-m", "--namespace=mine")) == 0
    assert _sent_spec(env / "jobs" / "job-m").namespace == "mine"
    config.write_text("namespce: x\n")
    assert main(["list"]) == 2
    assert "unknown key 'namespce'" in capsys.readouterr().err


def test_ctrl_c_while_following_cancels_the_job(env, tmp_path):
    env_vars = dict(os.environ, FAKE_MASTER_MODE="hang", PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "elasticdl.client", *job_argv("job-x")],
        cwd=tmp_path,
        env=env_vars,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stdout.readline()  # the master log is being streamed
        assert "fake master of job-x starting" in first
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "cancelling job job-x" in err
    status = LocalBackend().status("job-x")
    assert status.phase == "Cancelled"
    pid = json.loads((env / "jobs" / "job-x" / "job.json").read_text())["pid"]
    assert not pid_alive(pid)


def test_conflict_error_type(env, monkeypatch):
    monkeypatch.setenv("FAKE_MASTER_MODE", "hang")
    main(job_argv("job-y", "--detach"))
    backend = LocalBackend()
    try:
        from elasticdl.client.job_commands import job_parser, spec_from_flags

        spec, _ = spec_from_flags("train", job_parser("train").parse_args(job_argv("job-y")[1:]))
        with pytest.raises(JobConflictError):
            backend.submit(spec)
    finally:
        backend.cancel("job-y")


def test_job_dir_that_is_a_file_is_refused_in_one_line(env, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(job_argv("job-v", f"--job_dir={afile}")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("elasticdl: error: --job_dir") and "is not a directory" in err
    assert afile.read_text() == "x" and not (env / "jobs" / "job-v").exists()


@pytest.mark.parametrize("name", ["../x", "../../etc", "a/b", ".", "", "UP"])
def test_job_names_that_are_not_names_never_reach_outside_the_jobs_root(env, name):
    backend = LocalBackend()
    for call in (backend.status, backend.cancel, backend.available_logs):
        with pytest.raises(JobNotFoundError, match="is not a valid job name"):
            call(name)


def test_replica_names_never_reach_outside_the_logs_directory(env, capsys):
    assert main(job_argv("job-w", "--detach")) == 0
    assert LocalBackend().wait("job-w").phase == "Succeeded"
    capsys.readouterr()
    for replica in ("../job.json", "../../x", "/etc/passwd", ".hidden"):
        assert main(["logs", "job-w", f"--replica={replica}"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"elasticdl: error: --replica {replica!r} is not a replica name")
        assert "available: master" in err


def test_the_secret_file_name_is_the_masters():
    from elasticdl.common import job_dir
    from elasticdl.jobs.local_job_dir import SECRET_FILE

    assert SECRET_FILE == job_dir.SECRET_FILE
