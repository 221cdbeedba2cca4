"""Replicas end with the job's owner (real processes) and record their exit status."""
import os
import subprocess
import sys
import time

import elasticdl
from elasticdl.common.parent_watch import (
    EXIT_STATUS_FILE_ENV,
    EXIT_WITH_OWNER_ENV,
    owner_value,
    read_exit_status,
)

SRC = os.path.dirname(os.path.dirname(os.path.abspath(elasticdl.__file__)))
REPLICA = (
    "import sys, time; from elasticdl.common.parent_watch import exit_with_parent, run_main\n"
    "def main():\n"
    "    exit_with_parent()\n"
    "    time.sleep(float(sys.argv[1]))\n"
    "    return 3\n"
    "sys.exit(run_main(main))\n"
)


def _replica(env_extra, seconds):
    env = dict(os.environ, PYTHONPATH=SRC, **env_extra)
    return subprocess.Popen([sys.executable, "-c", REPLICA, str(seconds)], env=env)


def test_replica_stops_when_the_owner_is_gone_not_before(tmp_path):
    owner = subprocess.Popen(["sleep", "60"])
    status = tmp_path / "worker-0.exit"
    replica = _replica(
        {EXIT_WITH_OWNER_ENV: owner_value(owner.pid), EXIT_STATUS_FILE_ENV: str(status)}, 60
    )
    try:
        time.sleep(1.5)
        assert replica.poll() is None  # the owner lives: the replica goes on
        owner.kill()
        owner.wait()
        assert replica.wait(timeout=15) != 0
        # It stopped itself by SIGTERM: no exit status recorded, like any killed replica.
        assert read_exit_status(status) is None
    finally:
        for p in (owner, replica):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_an_owner_pid_reused_by_another_process_does_not_count(tmp_path):
    # The recorded start time does not match the live process with that pid.
    replica = _replica({EXIT_WITH_OWNER_ENV: f"{os.getpid()}:1"}, 60)
    try:
        assert replica.wait(timeout=15) != 0
    finally:
        if replica.poll() is None:
            replica.kill()


def test_exit_status_is_recorded(tmp_path):
    status = tmp_path / "ps-0.exit"
    replica = _replica({EXIT_STATUS_FILE_ENV: str(status)}, 0)
    assert replica.wait(timeout=30) == 3
    assert read_exit_status(status) == 3
