"""``elasticdl zoo init | build | push``: package a model zoo as a container image.

::

    cd my_models                      # holds model_zoo/ (with requirements.txt)
    elasticdl zoo init --model_zoo=model_zoo
    elasticdl zoo build --image=127.0.0.1:5000/team/models:v1 .
    elasticdl zoo push 127.0.0.1:5000/team/models:v1

``init`` writes ``./Dockerfile`` (see :mod:`elasticdl.client.zoo_dockerfile` for its layout);
``build``/``push`` talk to the engine in ``DOCKER_HOST`` (see
:mod:`elasticdl.client.image_builder`). Progress goes to stderr; the image id (build) or
digest (push) is the only line on stdout, for scripts.

Exit status: 0 done; 1 the engine failed (one line ``elasticdl: error: ...``); 2 bad input.
Usable on its own: ``python -m elasticdl.client.zoo build ...``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from elasticdl.client.zoo_dockerfile import (
    DEFAULT_BASE_IMAGE,
    ZooInitConfig,
    ZooInitError,
    init_model_zoo,
)

PROG = "elasticdl"
EXIT_FAILED, EXIT_USAGE = 1, 2


def _err(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def _init(args: argparse.Namespace) -> int:
    cfg = ZooInitConfig(
        base_image=args.base_image,
        model_zoo=args.model_zoo,
        cluster_spec=args.cluster_spec,
        local_pkg_dir=args.local_pkg_dir,
        extra_pypi_index=args.extra_pypi_index,
    )
    path = init_model_zoo(cfg, ".")
    _err(f"wrote {path} (FROM {cfg.base_image}); build it with '{PROG} zoo build --image=NAME .'")
    return 0


def _check_image(image: str, flag: str) -> None:
    """A bad image name is the user's to fix (exit 2), not the engine's failure (exit 1)."""
    from elasticdl.client.image_builder import ImageError, split_image_name

    try:
        split_image_name(image)
    except ImageError as e:
        raise ZooInitError(f"{flag}: {e}") from None


def _build(args: argparse.Namespace) -> int:
    from pathlib import Path

    from elasticdl.client.image_builder import ImageError, build_image

    context = Path(args.path)
    if not context.is_dir():
        raise ZooInitError(f"build context {args.path} is not a directory; pass the one to build")
    if not (context / args.dockerfile).is_file():
        raise ZooInitError(
            f"--dockerfile: no {args.dockerfile} in {args.path}; create it with "
            f"'{PROG} zoo init' (or pass --dockerfile)"
        )
    _check_image(args.image, "--image")
    try:
        buildargs = dict(_key_value(item) for item in args.build_arg)
        result = build_image(
            args.path,
            args.image,
            dockerfile=args.dockerfile,
            buildargs=buildargs,
            nocache=args.no_cache,
            base_url=args.docker_base_url or None,
        )
    except ImageError as e:
        _err(f"error: {e}")
        return EXIT_FAILED
    cached = len(result.cached_steps)
    _err(
        f"built {result.image} ({result.image_id[:19]}) in {result.seconds:.1f}s, {cached}/{result.steps} steps cached"
    )
    print(result.image_id, flush=True)
    return 0


def _push(args: argparse.Namespace) -> int:
    from elasticdl.client.image_builder import ImageError, push_image

    _check_image(args.image, "IMAGE")
    try:
        result = push_image(args.image, base_url=args.docker_base_url or None)
    except ImageError as e:
        _err(f"error: {e}")
        return EXIT_FAILED
    _err(
        f"pushed {result.image} in {result.seconds:.1f}s "
        f"({result.layers_pushed} layers uploaded, {result.layers_existing} already there)"
    )
    print(result.digest, flush=True)
    return 0


def _key_value(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ZooInitError(f"--build_arg={item} must look like NAME=VALUE")
    return key, value


def _subparser(sub, name: str, func, help: str) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help, description=help)
    # `_parser` lets elasticdl.client.main report unknown flags against this sub-command.
    parser.set_defaults(func=func, _parser=parser)
    return parser


def _engine_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--docker_base_url",
        default="",
        help="Engine API address, e.g. unix:///var/run/docker.sock or tcp://host:2376 (default: $DOCKER_HOST)",
    )


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``zoo`` and its sub-commands on an argparse ``subparsers`` object."""
    zoo = subparsers.add_parser(
        "zoo", help="Build and push model-zoo images", description="Build and push model-zoo images"
    )
    zoo.set_defaults(func=None, _parser=zoo)
    kwargs = {"dest": "zoo_command", "metavar": "ACTION"}
    if getattr(subparsers, "_parser_class", None) is not None:
        kwargs["parser_class"] = subparsers._parser_class  # keep the caller's strict parser
    sub = zoo.add_subparsers(**kwargs)

    init = _subparser(sub, "init", _init, "Write ./Dockerfile for a model zoo")
    init.add_argument(
        "--base_image",
        default=DEFAULT_BASE_IMAGE,
        help=f"Image with ElasticDL installed (default: {DEFAULT_BASE_IMAGE}, built by scripts/build-images.sh)",
    )
    init.add_argument(
        "--model_zoo", default=".", help="Model zoo directory inside the build context (default: .)"
    )
    init.add_argument(
        "--cluster_spec",
        default="",
        help="Cluster spec file, copied into the image at /cluster_spec/",
    )
    init.add_argument(
        "--local_pkg_dir", default="", help="Directory of *.whl files to install into the image"
    )
    init.add_argument("--extra_pypi_index", default="", help="Extra package index URL for pip")

    build = _subparser(sub, "build", _build, "Build the image of a model zoo")
    build.add_argument(
        "path", nargs="?", default=".", help="Build context holding the Dockerfile (default: .)"
    )
    build.add_argument(
        "--image", required=True, help="Image name and tag, e.g. 127.0.0.1:5000/team/models:v1"
    )
    build.add_argument(
        "--dockerfile", default="Dockerfile", help="Dockerfile path inside the context"
    )
    build.add_argument(
        "--build_arg", action="append", default=[], help="NAME=VALUE build argument (repeatable)"
    )
    build.add_argument("--no_cache", action="store_true", help="Do not reuse cached layers")
    _engine_flag(build)

    push = _subparser(sub, "push", _push, "Push an image to its registry")
    push.add_argument("image", help="Image name and tag, e.g. 127.0.0.1:5000/team/models:v1")
    _engine_flag(push)
    return zoo


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m elasticdl.client.zoo ACTION ...`` without the rest of the client."""
    parser = argparse.ArgumentParser(prog=f"{PROG} zoo")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_parser(sub)
    args = parser.parse_args(["zoo", *(sys.argv[1:] if argv is None else argv)])
    if not args.func:
        parser.parse_args(["zoo", "--help"])
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except ValueError as e:
        _err(f"error: {e}")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
