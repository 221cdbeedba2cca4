"""Entry point of the master: ``python -m elasticdl.master.main --job_spec=JSON`` (or
``--job_spec_file=PATH``), the job spec the client resolved (``JobSpec.to_json``).

Exit status: 0 when the job succeeded, 1 when it failed or was cancelled, 2 when the spec or
the model definition is unusable (one-line error on stderr, ``common.process_entry``); 3 when
a master under a Kubernetes Job was stopped while its Job still wants the job to run (a
deleted or evicted pod): the Job starts the next master, which resumes from the journal.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path

from elasticdl.common.job_dir import MARKER_FILE, STATUS_FILE, write_atomically
from elasticdl.common.process_entry import MASTER, UsageError, run_process

PROG = MASTER.prog
EXIT_FOR_NEXT_MASTER = 3

logger = logging.getLogger("elasticdl.master.main")


def read_job_spec(argv: list[str] | None = None):
    """The resolved job spec from ``--job_spec`` or ``--job_spec_file``; ValueError if bad."""
    from elasticdl.common.job_spec import spec_from_master_argv

    return spec_from_master_argv(sys.argv[1:] if argv is None else argv)


def main(argv: list[str] | None = None) -> int:
    return run_process(MASTER, argv, read_job_spec, _run_job, lambda spec: spec.log_file_path)


def _run_job(spec) -> int:
    from elasticdl.master.job import Job

    try:
        job = Job(spec)
    except ValueError as e:  # bad model definition or data: the user's to fix
        _record_failure(spec, str(e))
        raise UsageError(e) from None

    def on_signal(signum, frame):
        name = signal.Signals(signum).name
        if signum == signal.SIGTERM and getattr(job.platform, "master_still_wanted", bool)():
            # The pod was deleted or evicted, not the job: leave like a killed master (the
            # journal is already written, the replicas keep running) for the next one to resume.
            logger.warning("Received %s: the job goes on under the next master", name)
            for handler in logging.getLogger().handlers:
                handler.flush()
            os._exit(EXIT_FOR_NEXT_MASTER)
        logger.warning("Received %s: stopping the job", name)
        job.cancel()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = job.run()
    if code and getattr(job.platform, "restarts_dead_master", False):
        # The job ended here (its outcome is on the master pod's status label): exit 0, or
        # the Job that restarts dead masters would start another one.
        return 0
    return code


def _record_failure(spec, message: str) -> None:
    """A job that cannot start ends Failed with the reason, where the client reads its status
    (a job directory the client made): the user sees that reason, not an exit code."""
    if not spec.job_dir or not (Path(spec.job_dir) / MARKER_FILE).is_file():
        return
    from elasticdl.common.job_status import JobStatus
    from elasticdl.common.types import JobPhase

    status = JobStatus(
        job_name=spec.job_name,
        phase=JobPhase.FAILED,
        message=" ".join(message.splitlines()),
        updated_at=time.time(),
    )
    try:
        write_atomically(Path(spec.job_dir) / STATUS_FILE, status.to_json() + "\n")
    except OSError as e:
        logger.warning("Cannot write the job's status: %s", e)


if __name__ == "__main__":
    sys.exit(main())
