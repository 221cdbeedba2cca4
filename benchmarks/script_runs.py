"""What a benchmark's test needs to run its script once at a tiny size: the script in a child
process that imports what the test does, its JSON line, and the shared Fashion-MNIST cache."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def fashion_mnist_cache() -> str:
    """The prepared Fashion-MNIST the end-to-end tests share ($ELASTICDL_E2E_DATA overrides)."""
    default = Path.home() / ".cache" / "elasticdl" / "e2e" / "fashion_mnist"
    return os.environ.get("ELASTICDL_E2E_DATA") or str(default)


def run_script(
    script: str, *flags: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python <script> <flags>``, its output captured; the child imports from this process's
    path (under Pants: the sandbox's sources and generated protos), with ``env`` over this
    process's environment."""
    child_env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    child_env.update(env or {})
    return subprocess.run(
        [sys.executable, script, *flags],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env,
    )


def json_line(out: subprocess.CompletedProcess) -> dict:
    """The summary a benchmark prints as its last line."""
    return json.loads(out.stdout.strip().splitlines()[-1])
