"""Entry point of a parameter server process: ``python -m elasticdl.ps.main`` with the flags of
its :class:`~elasticdl.common.replica_spec.PSSpec`, which the master writes::

    python -m elasticdl.ps.main --ps_id=0 --num_ps_pods=2 --port=2222 --master_addr=host:50001 \
        --opt_type=Adam --opt_args="learning_rate=0.001;beta_1=0.9;" ...

Unknown flags and bad values exit with status 2 and a one-line message. SIGTERM/SIGINT stop
the server gracefully.
"""
from __future__ import annotations

import logging
import signal
import sys
import threading

from elasticdl.common.auth import MissingJobSecret, job_secret_from_env
from elasticdl.common.malloc_tuning import tune_malloc
from elasticdl.common.omp_tuning import passive_omp_wait
from elasticdl.common.parent_watch import exit_with_parent, run_main
from elasticdl.common.replica_spec import ps_spec_from_argv
from elasticdl.common.spec_codec import SpecError
from elasticdl.ps.errors import PSError

logger = logging.getLogger("elasticdl.ps.main")


def main(argv=None) -> int:
    # Before any model-sized buffer exists (see elasticdl.common.malloc_tuning).
    tune_malloc()
    # Before the native kernels load (see elasticdl.common.omp_tuning).
    passive_omp_wait()
    try:
        spec = ps_spec_from_argv(sys.argv[1:] if argv is None else argv)
        secret = job_secret_from_env()
    except (SpecError, MissingJobSecret) as e:
        print(f"elasticdl-ps: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=spec.log_level,
        format="%(asctime)s %(levelname)s [ps-%(process)d] %(name)s: %(message)s",
    )
    exit_with_parent()
    from elasticdl.ps.server import PSConfig, PSServer

    try:
        server = PSServer(PSConfig.from_spec(spec), secret=secret)
        server.start()
    except PSError as e:
        print(f"elasticdl-ps: error: {e}", file=sys.stderr)
        return 2

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


if __name__ == "__main__":
    # The exit status also goes to the file the master named: a restarted master that adopted
    # this process cannot wait for it (see elasticdl.common.parent_watch).
    sys.exit(run_main(main))
