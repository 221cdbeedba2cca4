"""Entry point of a parameter server process:

    python -m elasticdl.ps.main --ps_id 0 --num_ps_pods 2 --port 2222 --master_addr host:50001 \
        --opt_type Adam --opt_args "learning_rate=0.001;beta_1=0.9;"

Boolean flags accept `--flag` alone or `--flag=true|false|yes|no|1|0`. Unknown flags are logged
and ignored, so a newer master can pass flags an older PS does not know. Bad values exit with
status 2 and a one-line message. SIGTERM/SIGINT stop the server gracefully.
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from elasticdl.common.malloc_tuning import tune_malloc
from elasticdl.ps.errors import PSError

logger = logging.getLogger("elasticdl.ps.main")

_TRUE = {"true", "t", "yes", "y", "1"}
_FALSE = {"false", "f", "no", "n", "0"}


def parse_bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean; use true or false")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="elasticdl-ps", description="ElasticDL parameter server")

    def flag(name, help_):
        p.add_argument(name, type=parse_bool, nargs="?", const=True, default=False, help=help_)

    p.add_argument("--ps_id", type=int, default=0, help="index of this PS in [0, num_ps_pods)")
    p.add_argument("--num_ps_pods", type=int, default=1, help="number of PS in the job")
    p.add_argument("--port", type=int, default=2222, help="gRPC port (0 = pick a free one)")
    p.add_argument("--bind_host", default="0.0.0.0", help="address to listen on ('::' for IPv6)")
    p.add_argument("--master_addr", default="", help="master host:port for report_version")
    p.add_argument("--job_name", default="")
    p.add_argument("--namespace", default="", help="accepted for compatibility; unused")
    p.add_argument("--num_workers", type=int, default=0)
    flag("--use_async", "apply every gradient push immediately (no grads_to_wait)")
    p.add_argument(
        "--grads_to_wait", type=int, default=1, help="sync mode: pushes averaged into one update"
    )
    flag("--lr_staleness_modulation", "async: divide lr by the gradient's staleness")
    p.add_argument(
        "--sync_version_tolerance",
        type=int,
        default=0,
        help="sync mode: accept gradients at most this many versions old",
    )
    p.add_argument(
        "--evaluation_steps",
        type=int,
        default=0,
        help="report every N-th version to the master (0 = never)",
    )
    p.add_argument("--checkpoint_dir", default="")
    p.add_argument("--checkpoint_steps", type=int, default=0, help="save every N versions")
    p.add_argument("--keep_checkpoint_max", type=int, default=0, help="0 = keep all")
    p.add_argument(
        "--checkpoint_dir_for_init",
        default="",
        help="checkpoint (dir or version-V dir) to start from",
    )
    p.add_argument("--opt_type", default="SGD", help="SGD | Momentum | Adam | Adagrad")
    p.add_argument("--opt_args", default="", help='e.g. "learning_rate=0.1;momentum=0.9;"')
    p.add_argument(
        "--log_level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        type=lambda s: s.upper(),
    )
    p.add_argument("--log_every_versions", type=int, default=100)
    return p


def parse_args(argv=None):
    args, unknown = build_parser().parse_known_args(argv)
    return args, unknown


def config_from_args(args):
    from elasticdl.ps.server import PSConfig

    return PSConfig(
        ps_id=args.ps_id,
        num_ps_pods=args.num_ps_pods,
        port=args.port,
        bind_host=args.bind_host,
        master_addr=args.master_addr,
        job_name=args.job_name,
        use_async=args.use_async,
        grads_to_wait=args.grads_to_wait,
        lr_staleness_modulation=args.lr_staleness_modulation,
        sync_version_tolerance=args.sync_version_tolerance,
        evaluation_steps=args.evaluation_steps,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_steps=args.checkpoint_steps,
        keep_checkpoint_max=args.keep_checkpoint_max,
        checkpoint_dir_for_init=args.checkpoint_dir_for_init,
        num_workers=args.num_workers,
        opt_type=args.opt_type,
        opt_args=args.opt_args,
        log_every_versions=args.log_every_versions,
    )


def main(argv=None) -> int:
    # Before any model-sized buffer exists (see elasticdl.common.malloc_tuning).
    tune_malloc()
    args, unknown = parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s [ps-%(process)d] %(name)s: %(message)s",
    )
    if unknown:
        logger.warning("ignoring unknown arguments: %s", " ".join(unknown))
    from elasticdl.ps.server import PSServer

    try:
        server = PSServer(config_from_args(args))
        server.start()
    except PSError as e:
        print(f"elasticdl-ps: error: {e}", file=sys.stderr)
        return 2

    stop = threading.Event()

    def on_signal(signum, _frame):
        logger.info("PS %d got signal %d, shutting down", args.ps_id, signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(1.0):
        pass
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
