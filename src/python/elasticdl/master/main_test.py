"""What a user sees when a job cannot start: the master's one error line, no TensorFlow
start-up lines around it, exit status 2, and the reason as the job's final status."""

import json
import os
import subprocess
import sys
from pathlib import Path

import elasticdl
import elasticdl.master.main  # noqa: F401 (run as a process below; tells the build)
from elasticdl.common.job_dir import MARKER_FILE, STATUS_FILE
from elasticdl.common.job_spec import JobSpec

ZOO = str(Path(__file__).parent / "testdata" / "zoo")
SOURCE_ROOT = str(Path(elasticdl.__file__).resolve().parents[1])


def _master(spec: JobSpec, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    environ["PYTHONPATH"] = os.pathsep.join([SOURCE_ROOT, environ.get("PYTHONPATH", "")])
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "elasticdl.master.main", f"--job_spec={spec.to_json()}"],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )


def _spec(tmp_path) -> JobSpec:
    data = tmp_path / "no-data"
    data.mkdir()
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / MARKER_FILE).write_text("{}\n")  # a job directory the client made
    return JobSpec(
        job_name="no-data",
        model_zoo=ZOO,
        model_def="tiny.linear.custom_model",
        training_data=str(data),
        platform="local",
        job_dir=str(job_dir),
    )


def test_data_the_master_cannot_read_is_one_line_and_the_jobs_final_status(tmp_path):
    spec = _spec(tmp_path)
    done = _master(spec)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines  # TensorFlow imported the model, and said nothing
    assert lines[0].startswith("elasticdl master: error: directory "), lines
    assert "contains no RecordIO files" in lines[0]
    status = json.loads((Path(spec.job_dir) / STATUS_FILE).read_text())
    assert status["phase"] == "Failed" and status["message"] == lines[0].split(": error: ", 1)[1]


def test_tensorflows_start_up_lines_come_back_at_debug_or_when_the_user_asks(tmp_path):
    spec = _spec(tmp_path)
    done = _master(spec, TF_CPP_MIN_LOG_LEVEL="0")
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) > 1, done.stderr
    assert done.stderr.splitlines()[-1].startswith("elasticdl master: error: ")
