"""``elasticdl server``: run the job server, or add a user.

    elasticdl server --platform=local --state_dir=/srv/elasticdl [--host=127.0.0.1] [--port=8080]
                     [--tls_cert=cert.pem --tls_key=key.pem]
    elasticdl server add-user NAME --state_dir=/srv/elasticdl     # prints NAME's token once

The server binds the socket itself so that ``--port=0`` picks a free port; the first line on
stderr names the address (``listening on http://127.0.0.1:PORT``).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
from typing import TYPE_CHECKING, Sequence

from elasticdl.common.cli_parser import StrictArgumentParser
from elasticdl.server.config import MIB, ServerConfig
from elasticdl.server.errors import ServerError

if TYPE_CHECKING:
    from elasticdl.k8s.pod_logs import PodLogs

PROG = "elasticdl server"


def _serve_parser() -> StrictArgumentParser:
    parser = StrictArgumentParser(prog=PROG, description="Run the ElasticDL job server")
    parser.add_argument(
        "--platform",
        choices=("local", "kubernetes"),
        default="local",
        help="Where jobs run: local processes, or pods in --namespace (the server's service "
        "account needs deploy/k8s/server.yaml's Role there)",
    )
    parser.add_argument("--namespace", default="default", help="Kubernetes: the jobs' namespace")
    parser.add_argument("--kube_context", default="", help="Kubernetes: kubeconfig context")
    parser.add_argument(
        "--data_volume",
        default="",
        help="Kubernetes: the volume holding <state_dir>/data, as a job's --volume value "
        "(e.g. claim_name=edl-state,sub_path=data,mount_path=/data); data paths of jobs are "
        "paths in it",
    )
    parser.add_argument(
        "--image_pull_secrets",
        default="",
        help="Kubernetes: Secrets in --namespace (type kubernetes.io/dockerconfigjson, "
        "comma-separated) every job pod and build pod pulls its image with, for a registry "
        "that needs credentials to pull; the server never reads them",
    )
    builds = parser.add_argument_group(
        "image builds (Kubernetes)",
        "Jobs from an uploaded package run in an image a build pod makes: the base image + "
        "the package's requirements + the package at /model_zoo (deploy/k8s/README.md)",
    )
    builds.add_argument(
        "--build_base_image",
        default="",
        help="The base image, in the registry of --build_repository (e.g. "
        "registry.example:5000/elasticdl:cpu); the build pods run it",
    )
    builds.add_argument(
        "--build_repository",
        default="",
        help="Where built images go, HOST[:PORT]/NAME (tags come from the package id)",
    )
    builds.add_argument(
        "--state_volume",
        default="",
        help="The volume holding --state_dir, as build pods mount it: claim_name=PVC or "
        "host_path=DIR",
    )
    builds.add_argument(
        "--registry_secret",
        default="",
        help="A Secret in --namespace with keys username and password (push credentials)",
    )
    builds.add_argument(
        "--registry_insecure",
        action="store_true",
        help="Plain HTTP to the registry (one on loopback or without TLS inside the cluster)",
    )
    builds.add_argument(
        "--build_host_network",
        action="store_true",
        help="Build pods on the host network (a one-node cluster with its registry on loopback)",
    )
    parser.add_argument("--state_dir", required=True, help="Packages, data, jobs and tokens")
    parser.add_argument(
        "--state_lock_timeout",
        type=float,
        default=0,
        help="Seconds to wait for another server on --state_dir to stop (0: refuse at once); "
        "a replaced pod's predecessor may still be stopping",
    )
    parser.add_argument("--host", default="127.0.0.1", help="Address to listen on")
    parser.add_argument("--port", type=int, default=8080, help="Port (0: a free one)")
    parser.add_argument("--tls_cert", default="", help="PEM certificate chain (enables TLS)")
    parser.add_argument("--tls_key", default="", help="PEM private key of --tls_cert")
    parser.add_argument(
        "--max_package_mb", type=int, default=256, help="Largest package tarball accepted"
    )
    parser.add_argument(
        "--max_upload_mb", type=int, default=16 * 1024, help="Largest data file accepted"
    )
    limits = parser.add_argument_group(
        "connections",
        "Bounds on what a client holds: connections, and how long it may take to send a "
        "request (deploy/k8s/README.md)",
    )
    limits.add_argument(
        "--max_connections",
        type=int,
        default=256,
        help="Connections held at once, idle and log streams included; a request beyond "
        "them is answered 503",
    )
    limits.add_argument(
        "--header_timeout",
        type=float,
        default=10.0,
        help="Seconds a client may take to send a request's line and headers (then 408)",
    )
    limits.add_argument(
        "--body_timeout",
        type=float,
        default=30.0,
        help="Seconds a request's body may go without sending a byte (then 408); a large "
        "upload that keeps sending is never cut",
    )
    limits.add_argument(
        "--keep_alive_timeout",
        type=float,
        default=5.0,
        help="Seconds an idle connection is kept between requests, and the longest the rest "
        "of a body answered early (401, 413) is read and dropped",
    )
    parser.add_argument("--log_level", default="info", choices=("debug", "info", "warning"))
    return parser


def _add_user_parser() -> StrictArgumentParser:
    parser = StrictArgumentParser(
        prog=f"{PROG} add-user", description="Create a user and print its token once"
    )
    parser.add_argument("name", help="User name (lowercase letters, digits, '-')")
    parser.add_argument("--state_dir", required=True, help="The server's --state_dir")
    parser.add_argument("--replace", action="store_true", help="Give an existing user a new token")
    return parser


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    from elasticdl.common.job_spec import parse_pull_secrets
    from elasticdl.common.spec_codec import SpecError

    if bool(args.tls_cert) != bool(args.tls_key):
        raise SpecError("--tls_cert and --tls_key go together; give both or neither")
    for flag in ("tls_cert", "tls_key"):
        value = getattr(args, flag)
        if value and not os.path.isfile(value):
            raise SpecError(f"--{flag} {value!r} is not a file; check the path")
    if not 0 <= args.port < 65536:
        raise SpecError(f"--port must be 0..65535, got {args.port}")
    for flag in ("max_package_mb", "max_upload_mb"):
        if getattr(args, flag) <= 0:
            raise SpecError(f"--{flag} must be > 0, got {getattr(args, flag)}")
    if not 1 <= args.max_connections <= 65536:
        raise SpecError(f"--max_connections must be 1..65536, got {args.max_connections}")
    for flag in ("header_timeout", "body_timeout", "keep_alive_timeout"):
        if not 0 < getattr(args, flag) <= 3600:
            raise SpecError(f"--{flag} must be in (0, 3600] seconds, got {getattr(args, flag):g}")
    if args.data_volume and "mount_path=" not in args.data_volume:
        raise SpecError(
            f"--data_volume {args.data_volume!r} has no mount_path; e.g. "
            "claim_name=edl-state,sub_path=data,mount_path=/data"
        )
    if args.platform != "kubernetes" and (
        args.data_volume or args.kube_context or args.image_pull_secrets
    ):
        raise SpecError(
            "--data_volume, --kube_context and --image_pull_secrets are for --platform=kubernetes"
        )
    parse_pull_secrets(args.image_pull_secrets)
    _check_builds(args)
    return ServerConfig(
        namespace=args.namespace,
        kube_context=args.kube_context,
        data_volume=args.data_volume,
        image_pull_secrets=args.image_pull_secrets,
        build_base_image=args.build_base_image,
        build_repository=args.build_repository,
        state_volume=args.state_volume,
        registry_secret=args.registry_secret,
        registry_insecure=args.registry_insecure,
        build_host_network=args.build_host_network,
        state_dir=args.state_dir,
        platform=args.platform,
        host=args.host,
        port=args.port,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        max_package_bytes=args.max_package_mb * MIB,
        max_data_bytes=args.max_upload_mb * MIB,
        max_connections=args.max_connections,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        keep_alive_timeout=args.keep_alive_timeout,
    )


def _check_builds(args: argparse.Namespace) -> None:
    from elasticdl.common.spec_codec import SpecError
    from elasticdl.images.oci_build import BuildError, ImageRef

    flags = ("build_base_image", "build_repository", "state_volume")
    given = [f for f in flags if getattr(args, f)]
    if not given:
        return
    if args.platform != "kubernetes":
        raise SpecError(f"--{given[0]} is for --platform=kubernetes (image builds in the cluster)")
    missing = [f"--{f}" for f in flags if not getattr(args, f)]
    if missing:
        raise SpecError(f"image builds need {', '.join(missing)} too (or none of the three)")
    try:
        base = ImageRef.parse(args.build_base_image)
        target = ImageRef.parse(args.build_repository + ":x")
    except BuildError as e:
        raise SpecError(f"--build_base_image/--build_repository: {e}") from None
    if base.registry != target.registry:
        raise SpecError(
            "--build_base_image must be in the registry of --build_repository (the build "
            "mounts its layers there)"
        )
    key, _, value = args.state_volume.partition("=")
    if key not in ("claim_name", "host_path") or not value:
        raise SpecError(
            f"--state_volume {args.state_volume!r}: use claim_name=PVC or host_path=DIR"
        )


def _lock_state_dir(config: ServerConfig, timeout: float = 0) -> int:
    """One server per state directory: a second would clear the first's uploads in progress
    and race it for job names. The kernel drops the lock when the process dies (SIGKILL too),
    so a restarted server starts at once."""
    import fcntl

    from elasticdl.common.spec_codec import SpecError

    config.root.mkdir(parents=True, exist_ok=True)
    fd = os.open(config.root / "server.lock", os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + timeout
    waiting = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise SpecError(
                    f"another server is running on --state_dir {config.state_dir}; stop it or "
                    "choose another directory"
                ) from None
        if not waiting:
            waiting = True
            print(
                f"{PROG}: waiting up to {timeout:g} s for the server on --state_dir to stop",
                file=sys.stderr,
                flush=True,
            )
        time.sleep(0.2)


def serve(
    config: ServerConfig,
    log_level: str = "info",
    lock_timeout: float = 0,
    pod_logs: "PodLogs | None" = None,
) -> None:
    """Run the server until it is stopped. ``pod_logs``: where the logs of the jobs' pods
    are read (default: the Kubernetes API)."""
    import uvicorn
    from elasticdl.server.app import build_services, create_app
    from elasticdl.server.connections import uvicorn_settings

    # Held until this process ends, however it ends; the port is bound only once it is held.
    lock = _lock_state_dir(config, lock_timeout)
    app = create_app(config, build_services(config, pod_logs))
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, config.port))
    port = sock.getsockname()[1]
    scheme = "https" if config.tls_cert else "http"
    print(f"{PROG}: listening on {scheme}://{config.host}:{port}", file=sys.stderr, flush=True)
    uv_config = uvicorn.Config(
        app,
        log_level=log_level,
        ssl_certfile=config.tls_cert or None,
        ssl_keyfile=config.tls_key or None,
        # Log streams (follow) stay open; do not wait for them forever on shutdown.
        timeout_graceful_shutdown=5,
        **uvicorn_settings(
            config.max_connections, config.header_timeout, config.keep_alive_timeout
        ),
    )
    uvicorn.Server(uv_config).run(sockets=[sock])
    os.close(lock)


def main(argv: Sequence[str] | None = None, pod_logs: "PodLogs | None" = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if argv and argv[0] == "add-user":
            args = _add_user_parser().parse_args(argv[1:])
            from elasticdl.server.auth import TokenStore

            config = ServerConfig(state_dir=args.state_dir)
            config.make_dirs()
            token = TokenStore(config.tokens_file).add_user(args.name, replace=args.replace)
            print(token)
            print(
                f"{PROG}: created user {args.name}; the token above is shown only this once",
                file=sys.stderr,
            )
            return 0
        args = _serve_parser().parse_args(argv)
        if not 0 <= args.state_lock_timeout <= 3600:
            raise ValueError(
                f"--state_lock_timeout must be 0..3600 seconds, got {args.state_lock_timeout:g}"
            )
        serve(config_from_args(args), args.log_level, args.state_lock_timeout, pod_logs)
        return 0
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except (ValueError, ServerError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
