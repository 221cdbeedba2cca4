"""The ``elasticdl`` CLI run as a real process of this interpreter, as a user runs it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable


def run_cli(
    args: tuple[str, ...],
    cwd: Path,
    env: dict[str, str],
    timeout: float = 120,
    check: bool = True,
    diagnose: Callable[[], str] = lambda: "",
) -> subprocess.CompletedProcess:
    """``python -m elasticdl.client <args>`` in ``cwd`` with ``env``; with ``check``, a non-zero
    exit fails with the command, the tails of its output and diagnose()'s text."""
    proc = subprocess.run(
        [sys.executable, "-m", "elasticdl.client", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"elasticdl {' '.join(args)} exited {proc.returncode}:\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}{diagnose()}"
        )
    return proc
