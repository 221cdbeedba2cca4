"""How the client finds a program that runs the ElasticDL master.

The client itself never imports TensorFlow, so it starts the master as a separate program.
Candidates, first match wins:

1. ``$ELASTICDL_MASTER_PEX``: a ``master.pex`` (or any executable / Python script taking the
   master's flags). Executables run directly; a non-executable file runs with this interpreter.
2. ``dist/src.python.elasticdl.master/master.pex`` where this client was installed from: the
   checkout this module lives in (``src/python/elasticdl/client`` -> ``dist/``), or, for the
   client PEX ``dist/src.python.client/elasticdl.pex``, the ``dist/`` beside it (after
   ``./pants package ::``). Never the current directory or its parents: a ``master.pex`` that
   anyone could leave in a shared directory would run as the user.
3. This interpreter, if it has TensorFlow and ``elasticdl.master`` (``pip install elasticdl``
   or a development virtualenv): ``python -m elasticdl.master.main``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from pathlib import Path

from elasticdl.client.errors import ClientError

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


def install_roots(environ: dict[str, str] | None = None) -> list[Path]:
    """Directories that may hold this installation's ``dist/``: the checkout of this source
    file, and the parent of the ``dist/`` that holds the running client PEX."""
    environ = os.environ if environ is None else environ
    roots = []
    here = Path(__file__).resolve()
    if len(here.parents) > 4 and here.parents[0].name == "client":
        roots.append(here.parents[4])  # <checkout>/src/python/elasticdl/client/this.py
    pex = environ.get("PEX", "")  # set by the PEX bootstrap to the running PEX file
    if not pex and sys.argv and sys.argv[0].endswith(".pex"):
        pex = sys.argv[0]
    if pex:
        # <checkout>/dist/src.python.client/elasticdl.pex -> <checkout>
        roots.append(Path(pex).resolve().parents[2])
    return roots


def resolve_master_runtime(
    environ: dict[str, str] | None = None,
    roots: list[Path] | None = None,
    python: str | None = None,
    search_interpreter: bool = True,
) -> MasterRuntime:
    """``roots``: where to look for ``dist/`` (default :func:`install_roots`)."""
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

    for directory in install_roots(environ) if roots is None else roots:
        candidate = Path(directory) / PANTS_MASTER_PEX
        if candidate.is_file():
            return MasterRuntime(_program(candidate, python), {}, str(candidate))

    if search_interpreter and _has_module("tensorflow") and _has_module("elasticdl.master"):
        # The master must see the same packages as this interpreter, including ones put on
        # sys.path by PYTHONPATH or a .pth file; an empty entry means the current directory.
        pythonpath = os.pathsep.join(p or os.getcwd() for p in sys.path)
        return MasterRuntime(
            [python, "-m", MASTER_MODULE],
            {"PYTHONPATH": pythonpath},
            f"{python} -m {MASTER_MODULE}",
        )

    raise MasterRuntimeNotFound(
        "cannot find the ElasticDL master runtime: build it with "
        "'./pants package src/python/elasticdl/master:master' (or set $ELASTICDL_MASTER_PEX to a master.pex), "
        "or 'pip install elasticdl' into this Python"
    )
