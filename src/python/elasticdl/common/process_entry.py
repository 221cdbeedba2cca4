"""The life of a master, PS or worker process, the same for all three.

:func:`run_process` is each one's ``main``:

1. tuning that must come before any model-sized buffer or native kernel exists (glibc's malloc
   thresholds, ``common.malloc_tuning``; OpenMP's passive wait, ``common.omp_tuning``);
2. the spec from the command line; one that cannot be used is a usage error;
3. TensorFlow's C++ start-up lines (INFO) off unless the spec's log level is DEBUG, set before
   anything imports TensorFlow and inherited by the processes this one starts; one log format
   on stderr (and the spec's log file); the watch that ends a replica with its job
   (``common.parent_watch``); for a worker, SIGTERM ends it (exit status 143);
4. the role's work. A :class:`UsageError` raised there (a model, data or setting the user must
   fix) ends the process like a bad flag.

A usage error is one line on stderr, ``elasticdl <role>: error: <what and the fix>``, no
traceback, exit status 2; the log file gets it too. The exit status also goes to
``$ELASTICDL_EXIT_STATUS_FILE`` when the platform set it (``parent_watch.run_main``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading
from typing import Callable, Sequence, TypeVar

from elasticdl.common.malloc_tuning import tune_malloc
from elasticdl.common.omp_tuning import passive_omp_wait
from elasticdl.common.parent_watch import exit_with_parent, record_exit_status, run_main

LOG_FORMAT = "[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s"
EXIT_USAGE = 2
# TensorFlow's C++ logging: 0 all, 1 no INFO (its start-up lines), 2 no WARNING, 3 no ERROR.
TF_LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"

SpecT = TypeVar("SpecT")


class UsageError(Exception):
    """What the user must fix before the process can do its work (a model that does not load,
    data that cannot be read, a setting that does not fit): one line, exit status 2."""


@dataclasses.dataclass(frozen=True)
class Role:
    name: str  # "master", "ps", "worker": the error prefix is "elasticdl <name>: error:"
    tune_malloc: bool = False  # moves whole models per minibatch (PS, workers)
    passive_omp: bool = False  # runs the native kernels from many threads (PS)
    watch_parent: bool = False  # must not outlive its job (PS, workers)
    # Ends on SIGTERM. A container's PID 1 has no default action for it: without a handler a
    # deleted or preempted pod keeps its node's CPU for its whole grace period (30 s), and the
    # higher-priority pod waiting for it stays Pending that long. Its tasks go back to the
    # queue either way (the master re-queues a departed worker's tasks).
    stop_on_sigterm: bool = False

    @property
    def prog(self) -> str:
        return f"elasticdl {self.name}"


MASTER = Role("master")
PS = Role("ps", tune_malloc=True, passive_omp=True, watch_parent=True)
WORKER = Role("worker", tune_malloc=True, watch_parent=True, stop_on_sigterm=True)


def run_process(
    role: Role,
    argv: Sequence[str] | None,
    read_spec: Callable[[list[str]], SpecT],
    work: Callable[[SpecT], int],
    log_file: Callable[[SpecT], str] = lambda spec: "",
) -> int:
    """The process's exit status (see the module docstring). ``read_spec`` raises ``ValueError``
    (``SpecError``) or ``RuntimeError`` (a missing job secret) for what cannot be used."""
    return run_main(
        lambda: _run(role, list(sys.argv[1:] if argv is None else argv), read_spec, work, log_file)
    )


def _run(role, argv, read_spec, work, log_file) -> int:
    if role.tune_malloc:
        tune_malloc()
    if role.passive_omp:
        passive_omp_wait()
    try:
        spec = read_spec(argv)
    except (ValueError, RuntimeError) as e:
        return usage_error(role, e)
    quiet_tensorflow(spec.log_level)
    setup_logging(spec.log_level, log_file(spec))
    if role.watch_parent:
        exit_with_parent()
    if role.stop_on_sigterm:
        signal.signal(signal.SIGTERM, _stop_on_signal)
    try:
        return work(spec)
    except UsageError as e:
        return usage_error(role, e)
    finally:
        if _stopped_by is not None:
            _exit_now(_stopped_by)


# A stopped worker unwinds (its ``finally`` blocks report a finished task the master should not
# run again), then ends without the interpreter's shutdown: joining leftover threads and tearing
# TensorFlow down take seconds of the CPU the next pod waits for. Unwinding gets this long.
STOP_UNWIND_SECONDS = 2.0
_stopped_by: int | None = None


def _stop_on_signal(signum, frame) -> None:
    global _stopped_by
    if _stopped_by is not None:
        return
    _stopped_by = 128 + signum
    timer = threading.Timer(STOP_UNWIND_SECONDS, _exit_now, args=(_stopped_by,))
    timer.daemon = True
    timer.start()
    raise SystemExit(_stopped_by)


def _exit_now(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    logging.shutdown()
    record_exit_status(code)
    os._exit(code)


def usage_error(role: Role, error: BaseException) -> int:
    """Report ``error`` as the one line on stderr (and into the log file); exit status 2."""
    line = " ".join(str(error).splitlines()) or type(error).__name__
    print(f"{role.prog}: error: {line}", file=sys.stderr)
    record = logging.LogRecord(role.prog, logging.ERROR, __file__, 0, line, (), None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):  # stderr has it already
            handler.handle(record)
    return EXIT_USAGE


def quiet_tensorflow(log_level: str, environ=None) -> None:
    """TensorFlow's C++ INFO lines (oneDNN, CPU features) off unless ``log_level`` is DEBUG;
    a level the user set in the environment wins."""
    environ = os.environ if environ is None else environ
    environ.setdefault(TF_LOG_LEVEL_ENV, "0" if str(log_level).upper() == "DEBUG" else "1")


def setup_logging(level: str, log_file: str = "") -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(level=level, format=LOG_FORMAT, handlers=handlers, force=True)
