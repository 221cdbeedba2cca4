"""How the client finds a program that runs the ElasticDL master.

The client itself never imports TensorFlow, so it starts the master as a separate program.
Candidates, first match wins:

1. ``$ELASTICDL_MASTER_PEX``: a ``master.pex`` (or any executable / Python script taking the
   master's flags). Executables run directly; a non-executable file runs with this interpreter.
2. For the client PEX ``dist/src.python.client/elasticdl.pex``: the master PEX built beside it,
   ``dist/src.python.elasticdl.master/master.pex`` (``./pants package ::``).
3. This interpreter, if it has TensorFlow and ``elasticdl.master`` (``pip install elasticdl``
   or a development virtualenv): ``python -m elasticdl.master.main``.
4. For a client run from a checkout's sources without TensorFlow: that checkout's
   ``dist/src.python.elasticdl.master/master.pex``.

Never the current directory or its parents: a ``master.pex`` anyone could leave in a shared
directory (``/tmp``) would run as the user who submits a job there.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from pathlib import Path

from elasticdl.jobs.errors import ClientError

ENV_MASTER_PEX = "ELASTICDL_MASTER_PEX"
PANTS_MASTER_PEX = Path("dist") / "src.python.elasticdl.master" / "master.pex"
MASTER_MODULE = "elasticdl.master.main"


class MasterRuntimeNotFound(ClientError):
    pass


@dataclasses.dataclass(frozen=True)
class MasterRuntime:
    argv: list[str]  # the command; the master's flags are appended
    env: dict[str, str]  # added to the environment of the master
    description: str  # for logs and job.json

    def command(self, master_args: list[str]) -> list[str]:
        return [*self.argv, *master_args]


def _program(path: Path, python: str) -> list[str]:
    return [str(path)] if os.access(path, os.X_OK) else [python, str(path)]


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def client_pex_root(environ: dict[str, str] | None = None) -> Path | None:
    """The checkout whose ``dist/`` holds the running client PEX, if the client is one."""
    environ = os.environ if environ is None else environ
    pex = environ.get("PEX", "")  # set by the PEX bootstrap to the running PEX file
    if not pex and sys.argv and sys.argv[0].endswith(".pex"):
        pex = sys.argv[0]
    if not pex:
        return None
    path = Path(pex).resolve()  # <checkout>/dist/src.python.client/elasticdl.pex
    return path.parents[2] if len(path.parents) > 2 else None


def source_checkout_root() -> Path | None:
    """The checkout this module runs from (``<root>/src/python/elasticdl/jobs/``), if any."""
    here = Path(__file__).resolve()
    names = [p.name for p in here.parents[:4]]
    if names == ["jobs", "elasticdl", "python", "src"]:
        return here.parents[4]
    return None


def _pants_pex(root: Path | None, python: str) -> MasterRuntime | None:
    candidate = None if root is None else root / PANTS_MASTER_PEX
    if candidate is not None and candidate.is_file():
        return MasterRuntime(_program(candidate, python), {}, str(candidate))
    return None


def resolve_master_runtime(
    environ: dict[str, str] | None = None,
    pex_root: Path | None | bool = True,
    checkout_root: Path | None | bool = True,
    python: str | None = None,
    search_interpreter: bool = True,
) -> MasterRuntime:
    """``pex_root``/``checkout_root``: where to look for ``dist/`` (True: where this client
    runs from, :func:`client_pex_root` and :func:`source_checkout_root`)."""
    environ = os.environ if environ is None else environ
    python = python or sys.executable
    pex = environ.get(ENV_MASTER_PEX, "")
    if pex:
        path = Path(pex).expanduser()
        if not path.is_file():
            raise MasterRuntimeNotFound(
                f"${ENV_MASTER_PEX}={pex} is not a file; point it at master.pex or unset it"
            )
        return MasterRuntime(_program(path.resolve(), python), {}, f"{ENV_MASTER_PEX}={path}")

    if pex_root is True:
        pex_root = client_pex_root(environ)
    if checkout_root is True:
        checkout_root = source_checkout_root()
    found = _pants_pex(pex_root or None, python)
    if found is not None:
        return found

    if search_interpreter and _has_module("tensorflow") and _has_module("elasticdl.master"):
        # The master must see the same packages as this interpreter, including ones put on
        # sys.path by PYTHONPATH or a .pth file; an empty entry means the current directory.
        pythonpath = os.pathsep.join(p or os.getcwd() for p in sys.path)
        return MasterRuntime(
            [python, "-m", MASTER_MODULE],
            {"PYTHONPATH": pythonpath},
            f"{python} -m {MASTER_MODULE}",
        )

    found = _pants_pex(checkout_root or None, python)
    if found is not None:
        return found

    raise MasterRuntimeNotFound(
        "cannot find the ElasticDL master runtime: build it with "
        "'./pants package src/python/elasticdl/master:master' (or set $ELASTICDL_MASTER_PEX to a master.pex), "
        "or 'pip install elasticdl' into this Python"
    )
