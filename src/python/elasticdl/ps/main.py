"""Entry point of a parameter server process: ``python -m elasticdl.ps.main`` with the flags of
its :class:`~elasticdl.common.replica_spec.PSSpec`, which the master writes::

    python -m elasticdl.ps.main --ps_id=0 --num_ps_pods=2 --port=2222 --master_addr=host:50001 \
        --opt_type=Adam --opt_args="learning_rate=0.001;beta_1=0.9;" ...

Unknown flags and bad values exit with status 2 and a one-line message
(``common.process_entry``). SIGTERM/SIGINT stop the server gracefully.
"""
from __future__ import annotations

import logging
import signal
import sys
import threading

from elasticdl.common.auth import MissingJobSecret, job_secret_from_env
from elasticdl.common.process_entry import PS, UsageError, run_process
from elasticdl.common.replica_spec import ps_spec_from_argv
from elasticdl.ps.errors import PSError

logger = logging.getLogger("elasticdl.ps.main")


def _serve(spec) -> int:
    from elasticdl.ps.server import PSConfig, PSServer

    try:
        secret = job_secret_from_env()
        server = PSServer(PSConfig.from_spec(spec), secret=secret)
        server.start()
    except (MissingJobSecret, PSError) as e:
        raise UsageError(e) from None

    stop = threading.Event()

    def on_signal(signum, _frame):
        logger.info("PS %d got signal %d, shutting down", spec.ps_id, signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(1.0):
        pass
    server.stop()
    return 0


def main(argv=None) -> int:
    return run_process(PS, argv, ps_spec_from_argv, _serve)


if __name__ == "__main__":
    sys.exit(main())
