"""Entry point of the master: ``python -m elasticdl.master.main <job flags>``.

Exit status: 0 when the job succeeded, 1 when it failed or was cancelled, 2 when the flags or
the model definition are unusable (one-line error on stderr).
"""

from __future__ import annotations

import logging
import signal
import sys

LOG_FORMAT = "[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s"


def _setup_logging(level: str, log_file: str = "") -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(level=level, format=LOG_FORMAT, handlers=handlers, force=True)


def main(argv: list[str] | None = None) -> int:
    from elasticdl.common.args import parse_master_args

    try:
        args = parse_master_args(argv)
    except ValueError as e:
        print(f"elasticdl master: error: {e}", file=sys.stderr)
        return 2
    _setup_logging(args.log_level, args.log_file_path)
    logger = logging.getLogger("elasticdl.master.main")

    from elasticdl.master.job import Job

    try:
        job = Job(args)
    except ValueError as e:  # bad flags, model definition or data: the user's to fix
        print(f"elasticdl master: error: {e}", file=sys.stderr)
        logger.error("Job %s cannot start: %s", args.job_name, e)
        return 2

    def on_signal(signum, frame):
        logger.warning("Received %s: stopping the job", signal.Signals(signum).name)
        job.cancel()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return job.run()


if __name__ == "__main__":
    sys.exit(main())
