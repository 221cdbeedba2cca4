"""The ``elasticdl`` command line.

Startup must stay fast (``elasticdl --help`` well under a quarter of a second): this module
imports only the standard library and light client modules. TensorFlow never runs in the
client; the Kubernetes SDK, Docker, PyYAML and the dataset tools are imported inside the
handlers that need them.

Exit status: 0 success; 1 the job (or wait) did not succeed; 2 bad input (one line
``elasticdl: error: ...`` on stderr, nothing created); 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from elasticdl.common.cli_parser import StrictArgumentParser
from elasticdl.common.spec_codec import SpecError as ArgumentError
from elasticdl.common.types import JobPhase, PlatformName
from elasticdl.jobs.errors import WaitTimeout
from elasticdl.version import __version__

PROG = "elasticdl"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

logger = logging.getLogger(__name__)


def _err(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Handlers (heavy imports stay inside them)
# --------------------------------------------------------------------------------------------


def _progress_line(stream=None):
    """A progress callback printing one updating line on stderr (a terminal: at most 10 per
    second; elsewhere only the end of each file)."""
    import time

    stream = stream or sys.stderr
    tty = stream.isatty()
    last = [0.0]

    def report(done: int, total: int, name: str) -> None:
        now = time.monotonic()
        end = done >= total
        if not end and (not tty or now - last[0] < 0.1):
            return
        last[0] = now
        percent = 100 * done // total if total else 100
        line = f"{name}: {percent}% ({done / 2**20:.1f}/{total / 2**20:.1f} MiB)"
        stream.write(("\r" + line + " " * 8) if tty else line + "\n")
        if tty and end:
            stream.write("\n")
        stream.flush()

    return report


def _run_job(args: argparse.Namespace) -> int:
    from elasticdl import api
    from elasticdl.client.job_commands import given_job_values

    submit = getattr(api, args.command)  # api.train, api.evaluate, api.predict
    handle = submit(
        **given_job_values(args.command, args),
        package_path=args.package_path,
        yaml_path=args.yaml,
        progress=_progress_line(),
    )
    for notice in handle.notices:  # after submit: a rejected job prints its one error line only
        _err(notice)
    if handle.yaml_path:
        _err(
            f"wrote the master pod manifest of job {handle.job_name} to {handle.yaml_path} (nothing submitted)"
        )
        return EXIT_OK
    if handle.server:
        platform = handle.platform.removeprefix("server:")
        _err(f"submitted job {handle.job_name} to the job server {handle.server} ({platform})")
    else:
        where = f"job dir {handle.job_dir}" if handle.job_dir else f"namespace {handle.namespace}"
        _err(f"submitted job {handle.job_name} ({handle.platform}, {where})")
    if args.detach:
        print(handle.job_name)
        follow = f"follow it with '{PROG} logs -f {handle.job_name}'"
        if not handle.server:
            follow += f", check it with '{PROG} status {handle.job_name}'"
        _err(follow)
        return EXIT_OK
    return _follow(handle)


def _follow(handle) -> int:
    from elasticdl import api

    name = handle.job_name
    _err(
        "following the master log (Ctrl-C cancels the job; submit with --detach to return at once)"
    )
    shown = ""  # the log's tail, so the final line does not repeat the master's error line
    try:
        for chunk in api.logs(handle, "master", follow=True):
            sys.stdout.write(chunk)
            sys.stdout.flush()
            shown = (shown + chunk)[-_SHOWN_TAIL:]
        status = api.wait(handle, poll_interval=0.2)
    except KeyboardInterrupt:
        _err(f"interrupted: cancelling job {name} ...")
        try:
            status = api.cancel(handle)
            _err(f"job {name} {status.phase}")
        except KeyboardInterrupt:
            _err(f"cancel interrupted; run '{PROG} cancel {name}' to finish it")
        return EXIT_INTERRUPTED
    return _report_final(status, shown)


_SHOWN_TAIL = 4096


def _report_final(status, shown: str = "") -> int:
    if status.message and status.message.strip() in shown:
        message = " (the error above)"
    else:
        message = f": {status.message}" if status.message else ""
    _err(f"job {status.job_name} {status.phase}{message}")
    return EXIT_OK if status.phase == JobPhase.SUCCEEDED else EXIT_FAILED


def _target(args: argparse.Namespace) -> dict:
    """Where to look for jobs: the --platform, --namespace and --kube_context given."""
    return {
        k: getattr(args, k) for k in ("platform", "namespace", "kube_context") if hasattr(args, k)
    }


def _list(args: argparse.Namespace) -> int:
    from elasticdl import api
    from elasticdl.client.output import dump, jobs_table

    jobs = api.list_jobs(**_target(args), on_warning=lambda w: _err(f"warning: {w}"))
    if args.output_format == "table":
        if jobs:
            print(jobs_table(jobs))
        else:
            _err("no jobs found")
    else:
        print(dump([j.to_dict() for j in jobs], args.output_format))
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    from elasticdl import api
    from elasticdl.client.output import dump, status_text

    status = api.status(args.job, **_target(args))
    print(
        status_text(status)
        if args.output_format == "table"
        else dump(status.to_dict(), args.output_format)
    )
    return EXIT_OK


def _logs(args: argparse.Namespace) -> int:
    from elasticdl import api

    try:
        for chunk in api.logs(args.job, args.replica, follow=args.follow, **_target(args)):
            sys.stdout.write(chunk)
            sys.stdout.flush()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return EXIT_OK


def _wait(args: argparse.Namespace) -> int:
    from elasticdl import api

    if args.timeout is not None and not (0 < args.timeout < float("inf")):  # nan too
        raise ArgumentError(
            f"--timeout must be a finite number of seconds > 0, got {args.timeout:g}; "
            "leave it out to wait without a limit"
        )
    try:
        status = api.wait(args.job, timeout=args.timeout, **_target(args))
    except WaitTimeout as e:
        _err(f"error: {e}")
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return _report_final(status)


def _cancel(args: argparse.Namespace) -> int:
    from elasticdl import api

    before = api.status(args.job, **_target(args))
    status = api.cancel(args.job, **_target(args))
    if before.is_final:
        _err(f"job {args.job} had already finished: {status.phase}")
    else:
        _err(f"job {args.job} {status.phase}")
    return EXIT_OK


def _scale_ps(args: argparse.Namespace) -> int:
    from elasticdl import api

    if args.num_ps < 1:
        raise ArgumentError(f"--num_ps must be >= 1, got {args.num_ps}; ask for 1 PS or more")
    _err(api.scale_ps(args.job, args.num_ps, timeout=args.timeout, **_target(args)))
    return EXIT_OK


def _rbac(args: argparse.Namespace) -> int:
    from elasticdl.k8s import priority_classes, rbac

    if args.priority_classes:
        sys.stdout.write(priority_classes.render())
    else:
        sys.stdout.write(rbac.render(args.namespace))
    return EXIT_OK


def _version(args: argparse.Namespace) -> int:
    from elasticdl import api

    print(f"{PROG} {__version__} (python {sys.version.split()[0]})")
    try:
        server = api.server_version()
    except api.NoJobServerError:
        return EXIT_OK
    print(
        f"server {server['server']} at {server['url']} (API {server['api']}, "
        f"{server['platform']} jobs, user {server['user']})"
    )
    return EXIT_OK


def _upload(args: argparse.Namespace) -> int:
    from elasticdl import api

    stored = api.upload(args.src, args.dest, progress=_progress_line())
    size = sum(s["size"] for s in stored)
    _err(
        f"uploaded {len(stored)} file(s), {size / 2**20:.1f} MiB, to {args.dest} (sha256 verified)"
    )
    return EXIT_OK


def _download(args: argparse.Namespace) -> int:
    from elasticdl import api

    files = api.download(args.src, args.dest, progress=_progress_line())
    _err(f"downloaded {len(files)} file(s) to {args.dest} (sha256 verified)")
    return EXIT_OK


def _server(args: argparse.Namespace) -> int:
    # Reached only for 'elasticdl server --help' listings; main() hands 'server' over first.
    return _run_server([])


def _run_server(argv: list[str]) -> int:
    try:
        # Not a build dependency: the server ships as its own PEX and wheel.
        from elasticdl.server.main import main as server_main  # pants: no-infer-dep
    except ImportError as e:
        raise ArgumentError(
            f"the job server is not part of this installation ({e}); use elasticdl-server.pex "
            "or install fastapi and uvicorn"
        ) from None
    return server_main(argv)


def _datasets_module():
    try:
        from elasticdl.data import datasets
    except ImportError as e:
        raise ArgumentError(
            f"dataset preparation is not available in this installation ({e})"
        ) from None
    return datasets


def _dataset_list(args: argparse.Namespace) -> int:
    from elasticdl.client.output import table

    names = getattr(_datasets_module(), "DATASETS", {})
    print(table(("NAME", "DESCRIPTION"), sorted(dict(names).items())))
    return EXIT_OK


_DATASET_PARAMS = ("rows", "features", "vocab", "zipf", "seed")


def _dataset_prepare(args: argparse.Namespace) -> int:
    datasets = _datasets_module()
    names = getattr(datasets, "DATASETS", None)
    if names is not None and args.name not in names:
        raise ArgumentError(
            f"unknown dataset {args.name!r}; available: {', '.join(sorted(names))} (see '{PROG} dataset list')"
        )
    params = {k: getattr(args, k) for k in _DATASET_PARAMS if getattr(args, k) is not None}
    result = datasets.prepare(
        args.name,
        args.output,
        source=args.source,
        progress=not args.no_progress,
        schema=args.schema,
        params=params,
        limit=args.limit,
    )
    _err(getattr(result, "message", "") or f"dataset {args.name} is ready in {args.output}")
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# Parser
# --------------------------------------------------------------------------------------------


def _add_command(subparsers, name: str, func, help: str, **kwargs) -> StrictArgumentParser:
    parser = subparsers.add_parser(name, help=help, description=help, **kwargs)
    parser.set_defaults(func=func, _parser=parser)
    return parser


def _add_target_params(parser: argparse.ArgumentParser) -> None:
    """Where to look for jobs (list/status/logs/wait/cancel)."""
    # Not given -> absent (SUPPRESS), so the config file can fill it in.
    parser.add_argument(
        "--platform",
        choices=[p.value for p in PlatformName],
        default=argparse.SUPPRESS,
        help="Where the jobs run (default: where a job of that name is, locally first, then "
        "in the configured cluster; list: both)",
    )
    parser.add_argument(
        "--namespace",
        default=argparse.SUPPRESS,
        help="Kubernetes namespace (default: default, or the config file)",
    )
    parser.add_argument(
        "--kube_context",
        default=argparse.SUPPRESS,
        help="kubeconfig context (default: the current one, or the config file)",
    )


def _add_output_param(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        dest="output_format",
        choices=("table", "json", "yaml"),
        default="table",
        help="Output format",
    )


def build_parser() -> StrictArgumentParser:
    from elasticdl.client.job_commands import JOB_COMMANDS, USAGES, add_job_command_params

    parser = StrictArgumentParser(
        prog=PROG,
        description="ElasticDL: elastic distributed training on your machine or on Kubernetes.",
        epilog=f"Run '{PROG} COMMAND --help' for the flags of a command.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=StrictArgumentParser
    )

    for command, help_text in JOB_COMMANDS.items():
        job = _add_command(sub, command, _run_job, help_text, usage=USAGES[command])
        add_job_command_params(command, job)

    dataset = _add_command(sub, "dataset", None, "Prepare example datasets")
    dataset_sub = dataset.add_subparsers(
        dest="dataset_command", metavar="ACTION", parser_class=StrictArgumentParser
    )
    prepare = _add_command(
        dataset_sub, "prepare", _dataset_prepare, "Download/convert a dataset into RecordIO shards"
    )
    prepare.add_argument("name", help=f"Dataset name (see '{PROG} dataset list')")
    prepare.add_argument("--output", required=True, help="Output directory")
    prepare.add_argument(
        "--source", default=None, help="Local copy of the raw dataset (no download)"
    )
    prepare.add_argument(
        "--no-progress", dest="no_progress", action="store_true", help="Do not show progress"
    )
    prepare.add_argument(
        "--limit",
        type=int,
        default=None,
        help="Keep the first N rows of each split (fashion_mnist) or of the table, for a quick "
        "run (default: all)",
    )
    prepare.add_argument(
        "--schema",
        choices=("default", "original"),
        default="default",
        help="Record schema: this project's model zoo's (default), or what the original "
        "ElasticDL's data generators wrote (original; fashion_mnist and census)",
    )

    # Parameters of generated datasets (synthetic_ctr); the dataset checks them.
    for flag, kind, text in (
        ("rows", int, "rows to generate (train + test; the last 10%% are the test split)"),
        ("features", int, "categorical features per row"),
        ("vocab", int, "ids per categorical feature (up to 10^8)"),
        ("zipf", float, "Zipf exponent of the ids (0 = uniform)"),
        ("seed", int, "seed; the output is a function of the parameters"),
    ):
        prepare.add_argument(f"--{flag}", type=kind, default=None, help=f"synthetic_ctr: {text}")

    listing = _add_command(dataset_sub, "list", _dataset_list, "List the datasets 'prepare' knows")
    del listing

    _add_zoo(sub)

    lst = _add_command(sub, "list", _list, "List jobs")
    _add_target_params(lst)
    _add_output_param(lst)

    status = _add_command(sub, "status", _status, "Show the status of a job")
    status.add_argument("job", help="Job name")
    _add_target_params(status)
    _add_output_param(status)

    logs = _add_command(sub, "logs", _logs, "Print the log of a job's master, PS or worker")
    logs.add_argument("job", help="Job name")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="Keep printing until the replica ends"
    )
    logs.add_argument(
        "--replica",
        default="master",
        help="master (default), ps-N, worker-N, or build (a job server's image build)",
    )
    _add_target_params(logs)

    wait = _add_command(
        sub, "wait", _wait, "Wait until a job ends (exit 0 if it succeeded, else 1)"
    )
    wait.add_argument("job", help="Job name")
    wait.add_argument("--timeout", type=float, default=None, help="Give up after this many seconds")
    _add_target_params(wait)

    cancel = _add_command(sub, "cancel", _cancel, "Stop a job and everything it started")
    cancel.add_argument("job", help="Job name")
    _add_target_params(cancel)

    scale_ps = _add_command(
        sub,
        "scale-ps",
        _scale_ps,
        "Change a running job's number of parameter servers (its model is re-sharded; "
        "training pauses meanwhile)",
    )
    scale_ps.add_argument("job", help="Job name")
    scale_ps.add_argument(
        "--num_ps", type=int, required=True, help="How many PS the job runs from now on (>= 1)"
    )
    scale_ps.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="Seconds to wait for the master's answer (default: 30 local, 60 on Kubernetes)",
    )
    _add_target_params(scale_ps)

    rbac = _add_command(
        sub,
        "rbac",
        _rbac,
        "Print the ServiceAccount, Role and RoleBinding a job's master needs in a Kubernetes "
        "namespace (pipe it to 'kubectl apply -f -')",
    )
    rbac.add_argument("--namespace", default="default", help="The jobs' namespace")
    rbac.add_argument(
        "--priority_classes",
        action="store_true",
        help="Print ElasticDL's PriorityClasses instead (cluster-wide; for a cluster admin)",
    )

    upload = _add_command(
        sub,
        "upload",
        _upload,
        "Upload a file or directory to your data directory on the job server",
    )
    upload.add_argument("src", help="Local file or directory")
    upload.add_argument("dest", help="Path in your data directory, e.g. fashion_mnist/train")
    download = _add_command(
        sub, "download", _download, "Download a file or directory from the job server"
    )
    download.add_argument("src", help="Path in your data directory")
    download.add_argument("dest", help="Local file or directory")
    _add_command(
        sub,
        "server",
        _server,
        "Run the job server, or add a user: 'elasticdl server --help', "
        "'elasticdl server add-user NAME --state_dir=DIR'",
        add_help=False,
    )

    _add_command(sub, "version", _version, "Print the ElasticDL version (and the job server's)")
    return parser


def _add_zoo(sub) -> None:
    """``zoo init|build|push`` live in ``elasticdl.client.zoo`` (image building)."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("elasticdl.client.zoo") is None:
        return  # not part of this installation
    try:
        zoo = importlib.import_module("elasticdl.client.zoo")
    except ImportError as e:
        reason = str(e)

        def unavailable(args: argparse.Namespace) -> int:
            raise ArgumentError(f"zoo commands are unavailable: {reason}")

        _add_command(sub, "zoo", unavailable, "Build and push model-zoo images (unavailable)")
        return
    zoo.add_parser(sub)


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "server":  # its own flags and sub-commands: elasticdl.server.main
        try:
            return _run_server(argv[1:])
        except ArgumentError as e:
            _err(f"error: {e}")
            return EXIT_USAGE
    logging.basicConfig(level=logging.WARNING, format=f"{PROG}: %(levelname)s: %(message)s")
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except ArgumentError as e:
        _err(f"error: {e}")
        return EXIT_USAGE
    except SystemExit as e:  # --help / --version
        return e.code if isinstance(e.code, int) else EXIT_OK
    func = getattr(args, "func", None)
    if func is None:
        # "elasticdl" or "elasticdl dataset" without an action: show what there is.
        target = parser
        if getattr(args, "command", None):
            target = parser._subparsers._group_actions[0].choices[args.command]  # type: ignore[union-attr]
        target.print_help()
        return EXIT_USAGE if getattr(args, "command", None) else EXIT_OK
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `elasticdl logs x | head`: the reader is gone, stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except ValueError as e:  # ArgumentError, ClientError, ResourceError, ... : user errors
        _err(f"error: {e}")
        return EXIT_USAGE
    except OSError as e:
        _err(f"error: {e}")
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
