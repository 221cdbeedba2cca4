import dataclasses
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from elasticdl.common import parent_watch, process_entry
from elasticdl.common.process_entry import Role, UsageError, quiet_tensorflow, run_process
from elasticdl.common.spec_codec import SpecError

ROLE = Role("worker")  # no tuning, no parent watch: nothing here outlives the test


@dataclasses.dataclass
class Spec:
    log_level: str = "INFO"
    log_file: str = ""


@pytest.fixture(autouse=True)
def _keep_logging_and_environment():
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    tf_level = os.environ.get(process_entry.TF_LOG_LEVEL_ENV)
    yield
    root.handlers[:] = saved
    root.setLevel(level)
    if tf_level is None:
        os.environ.pop(process_entry.TF_LOG_LEVEL_ENV, None)
    else:
        os.environ[process_entry.TF_LOG_LEVEL_ENV] = tf_level


def _read(argv):
    if argv:
        raise SpecError(f"unrecognized arguments: {' '.join(argv)}")
    return Spec()


def test_a_bad_flag_is_one_line_with_the_roles_prefix_and_exit_2(capsys):
    assert run_process(ROLE, ["--bogus=1"], _read, lambda spec: 0) == 2
    assert capsys.readouterr().err == "elasticdl worker: error: unrecognized arguments: --bogus=1\n"


def test_a_usage_error_of_the_work_is_one_line_on_stderr_and_in_the_log_file(tmp_path, capsys):
    log = tmp_path / "master.log"

    def work(spec):
        logging.getLogger("x").info("starting")
        raise UsageError("model.py line 3: SyntaxError\nsecond line")

    code = run_process(
        Role("master"), [], lambda argv: Spec(log_file=str(log)), work, lambda s: s.log_file
    )
    assert code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "elasticdl master: error: model.py line 3: SyntaxError second line"
    assert not any("Traceback" in line for line in err)
    assert "starting" in log.read_text()
    assert log.read_text().splitlines()[-1].endswith("model.py line 3: SyntaxError second line")


def test_the_works_status_is_the_processes_and_goes_to_the_exit_status_file(tmp_path, monkeypatch):
    status_file = tmp_path / "worker-0.exit"
    monkeypatch.setenv("ELASTICDL_EXIT_STATUS_FILE", str(status_file))
    assert run_process(ROLE, [], _read, lambda spec: 1) == 1
    assert status_file.read_text() == "1\n"


def test_tensorflows_info_lines_are_off_unless_debug_or_the_user_chose():
    env = {}
    quiet_tensorflow("INFO", env)
    assert env == {process_entry.TF_LOG_LEVEL_ENV: "1"}
    env = {}
    quiet_tensorflow("debug", env)
    assert env == {process_entry.TF_LOG_LEVEL_ENV: "0"}
    env = {process_entry.TF_LOG_LEVEL_ENV: "3"}
    quiet_tensorflow("INFO", env)
    assert env == {process_entry.TF_LOG_LEVEL_ENV: "3"}


def test_the_roles_tune_what_they_need():
    assert process_entry.PS.tune_malloc and process_entry.PS.passive_omp
    assert process_entry.WORKER.tune_malloc and not process_entry.WORKER.passive_omp
    assert process_entry.PS.watch_parent and process_entry.WORKER.watch_parent
    assert not process_entry.MASTER.watch_parent
    assert process_entry.MASTER.prog == "elasticdl master"


@pytest.mark.parametrize("unwinding", ["time.sleep(0)", "time.sleep(60)"])
def test_a_worker_ends_on_sigterm_with_status_143(tmp_path, unwinding):
    """A worker stops when told to (a pod deleted or preempted): as a container's PID 1 it has
    no default action for SIGTERM, so the role installs one; here in a child process (the
    handler ends the process). Its ``finally`` blocks run, for at most STOP_UNWIND_SECONDS;
    then it ends at once, as the default action would, not after the threads still running (a
    worker's prefetch or RPC threads) or the interpreter's shutdown."""
    assert process_entry.WORKER.stop_on_sigterm
    status = tmp_path / "status"
    code = textwrap.dedent(
        f"""
        import dataclasses, sys, threading, time
        from elasticdl.common import process_entry

        role = dataclasses.replace(process_entry.WORKER, tune_malloc=False, watch_parent=False)

        def work(spec):
            threading.Thread(target=time.sleep, args=(120,)).start()  # not a daemon
            try:
                print("working", flush=True)  # in the try: SIGTERM may come at once
                time.sleep(60)
            finally:
                print("unwinding", flush=True)
                {unwinding}
            return 0

        spec = lambda argv: type("Spec", (), {{"log_level": "INFO"}})()
        sys.exit(process_entry.run_process(role, [], spec, work))
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env[parent_watch.EXIT_STATUS_FILE_ENV] = str(status)
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert child.stdout.readline() == "working\n"
        child.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert child.wait(timeout=30) == 143
        assert time.monotonic() - started < process_entry.STOP_UNWIND_SECONDS + 3
        assert child.stdout.read() == "unwinding\n"
    finally:
        child.kill()
    assert status.read_text() == "143\n"
