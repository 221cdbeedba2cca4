"""Entry point of the master: ``python -m elasticdl.master.main --job_spec=JSON`` (or
``--job_spec_file=PATH``), the job spec the client resolved (``JobSpec.to_json``).

Exit status: 0 when the job succeeded, 1 when it failed or was cancelled, 2 when the spec or
the model definition is unusable (one-line error on stderr); 3 when a master under a Kubernetes
Job was stopped while its Job still wants the job to run (a deleted or evicted pod): the Job
starts the next master, which resumes from the journal.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

LOG_FORMAT = "[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s"
PROG = "elasticdl master"
EXIT_FOR_NEXT_MASTER = 3


def _setup_logging(level: str, log_file: str = "") -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(level=level, format=LOG_FORMAT, handlers=handlers, force=True)


def read_job_spec(argv: list[str] | None = None):
    """The resolved job spec from ``--job_spec`` or ``--job_spec_file``; ValueError if bad."""
    from elasticdl.common.job_spec import spec_from_master_argv

    return spec_from_master_argv(sys.argv[1:] if argv is None else argv)


def _log_to_files(logger: logging.Logger, message: str) -> None:
    """An error for the log file only: stderr has it already, as the one error line."""
    record = logger.makeRecord(logger.name, logging.ERROR, __file__, 0, message, (), None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def main(argv: list[str] | None = None) -> int:
    try:
        spec = read_job_spec(argv)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    _setup_logging(spec.log_level, spec.log_file_path)
    logger = logging.getLogger("elasticdl.master.main")

    from elasticdl.master.job import Job

    try:
        job = Job(spec)
    except ValueError as e:  # bad model definition or data: the user's to fix
        print(f"{PROG}: error: {e}", file=sys.stderr)
        _log_to_files(logger, f"Job {spec.job_name} cannot start: {e}")
        return 2

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


if __name__ == "__main__":
    sys.exit(main())
