"""The job's owner: the /bin/sh supervisor a local master runs under (real processes)."""
import subprocess
import sys

import pytest
from elasticdl.jobs.errors import ClientError
from elasticdl.jobs.local_processes import OWNER_SCRIPT, master_restarts

# A "master" that counts its lives in a file and is SIGKILLed in the first `deaths` of them.
MASTER = (
    "import os, signal, sys\n"
    "path, deaths = sys.argv[1], int(sys.argv[2])\n"
    "n = int(open(path).read()) + 1 if os.path.exists(path) else 1\n"
    "open(path, 'w').write(str(n))\n"
    "print('owner', os.environ['ELASTICDL_JOB_OWNER'] == str(os.getppid()), flush=True)\n"
    "if n <= deaths: os.kill(os.getpid(), signal.SIGKILL)\n"
    "sys.exit(int(sys.argv[3]))\n"
)


def _run(job_dir, restarts, deaths, code=0):
    lives = job_dir / "lives"
    proc = subprocess.run(
        ["/bin/sh", "-c", OWNER_SCRIPT, str(job_dir / "exit_code"), str(restarts)]
        + [sys.executable, "-c", MASTER, str(lives), str(deaths), str(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc, int(lives.read_text()), int((job_dir / "exit_code").read_text())


def test_a_killed_master_is_started_again(tmp_path):
    proc, lives, code = _run(tmp_path, restarts=5, deaths=2)
    assert (proc.returncode, lives, code) == (0, 3, 0)
    assert proc.stdout.count("starting it again") == 2 and "(2/5)" in proc.stdout
    assert proc.stdout.count("owner True") == 3


def test_restarts_are_bounded_and_failures_are_not_restarted(tmp_path):
    proc, lives, code = _run(tmp_path, restarts=1, deaths=5)
    assert (proc.returncode, lives, code) == (137, 2, 137)
    (tmp_path / "lives").unlink()
    proc, lives, code = _run(tmp_path, restarts=5, deaths=0, code=1)  # the job failed
    assert (proc.returncode, lives, code) == (1, 1, 1)


def test_a_cancelled_job_is_not_restarted(tmp_path):
    (tmp_path / "cancelled").write_text("now\n")
    proc, lives, code = _run(tmp_path, restarts=5, deaths=1)
    assert (lives, code) == (1, 137)


def test_restart_limit_from_the_environment():
    assert master_restarts({}) == 10
    assert master_restarts({"ELASTICDL_MASTER_RESTARTS": "0"}) == 0
    with pytest.raises(ClientError, match="ELASTICDL_MASTER_RESTARTS.*whole number"):
        master_restarts({"ELASTICDL_MASTER_RESTARTS": "-1"})
