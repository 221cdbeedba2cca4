"""What a model zoo needs beyond the runtime: its `requirements.txt` and, for models written for
`tf.keras` 2.x, TensorFlow's legacy Keras (`tf-keras`).

Both are installed once into a cached directory keyed by their content (the Python and
TensorFlow versions, the Keras choice and the requirements file), appended to `sys.path` of
every process that loads the model (master, workers): a layer over the runtime, which keeps
every package it already has (the way Ray's `runtime_env` pip works). The first process to
need it installs it, under a file lock; the others wait for it and then only add the path.

Keras 2 is chosen per job: `TF_USE_LEGACY_KERAS=1` (or `0`) in the job's environment
(`--envs`), else detected from the model's package (`DenseFeatures`, feature columns,
`tensorflow.python.keras`, `tf.keras.backend`, `tf_keras`, the original's `feature_column`
module). TensorFlow reads
the variable at the first use of `tf.keras`, so it is set before the model file is imported.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

logger = logging.getLogger(__name__)

LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"
CACHE_ENV = "ELASTICDL_CACHE_DIR"
_TRUE = ("1", "true", "True")
_FALSE = ("0", "false", "False")
# Source text that means "written for tf.keras 2.x" (absent from Keras 3).
KERAS2_MARKERS = re.compile(
    r"\bDenseFeatures\b|\btf\.feature_column\b|\btensorflow\.python\.keras\b"
    r"|^\s*(?:import|from)\s+tf_keras\b|\belasticdl\.python\.elasticdl\.feature_column\b"
    # Keras 2's backend functions (K.sum, K.square, ...): Keras 3's backend module lacks them.
    r"|\b(?:tf|tensorflow)\.keras\.backend\b",
    re.MULTILINE,
)
# Distributions the runtime provides under another name: never installed beside it.
_RUNTIME_ALIASES = {"tensorflow": ("tensorflow-cpu", "tensorflow"), "keras": ("keras",)}


class RuntimeEnvError(ValueError):
    """A requirement cannot be installed; one line, naming it and the fix."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed_version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def tensorflow_version() -> Optional[str]:
    return _installed_version("tensorflow-cpu") or _installed_version("tensorflow")


def uses_keras2(model_file: str) -> bool:
    """Whether the model needs tf.keras 2: the job's TF_USE_LEGACY_KERAS, else the model file
    and the other Python files of its directory mention Keras-2-only APIs."""
    value = os.environ.get(LEGACY_KERAS_ENV)
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    directory = os.path.dirname(os.path.abspath(model_file))
    files = [model_file] + sorted(
        os.path.join(directory, n)
        for n in os.listdir(directory)
        if n.endswith(".py") and os.path.join(directory, n) != model_file
    )
    for path in files:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                if KERAS2_MARKERS.search(f.read()):
                    return True
        except OSError:
            continue
    return False


def tf_keras_requirement() -> str:
    """tf-keras of the installed TensorFlow's minor version (tf-keras 2.16.x for TF 2.16)."""
    version = tensorflow_version()
    if not version:
        raise RuntimeEnvError("tf.keras 2 needs TensorFlow, which is not installed here")
    major, minor = version.split(".")[:2]
    return f"tf-keras~={major}.{minor}.0"


def read_requirements(path: str) -> List[str]:
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        lines = [line.split("#", 1)[0].strip() for line in f]
    return [line for line in lines if line]


def cache_root() -> str:
    root = os.environ.get(CACHE_ENV) or os.path.join("~", ".cache", "elasticdl")
    return os.path.join(os.path.abspath(os.path.expanduser(root)), "envs")


def _pip() -> List[str]:
    """pip of this interpreter, else a pip on PATH working on this interpreter (--python)."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    for name in ("pip3", "pip"):
        exe = shutil.which(name)
        if exe:
            return [exe, "--python", sys.executable]
    raise RuntimeEnvError(
        "no pip to install the model zoo's requirements with; install pip, or the packages "
        "themselves into the job's runtime"
    )


_PIP_FLAGS = ["--disable-pip-version-check", "--no-input", "--timeout", "20", "--retries", "2"]


def _run_pip(args: Sequence[str], what: str) -> str:
    cmd = _pip() + list(args[:1]) + _PIP_FLAGS + list(args[1:])
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_pip_env()
    )
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        lines.append(line)
        if line.startswith(("Collecting", "Downloading", "Installing", "Successfully")):
            logger.info("%s: %s", what, line.strip())
    if proc.wait() != 0:
        errors = [ln.strip() for ln in lines if ln.strip().startswith("ERROR")]
        last = (errors or [ln.strip() for ln in lines if ln.strip()] or ["pip failed"])[-1]
        raise RuntimeEnvError(
            f"{what}: {last} (fix the requirement, or install it into the job's runtime)"
        )
    return "\n".join(lines)


def _pip_env() -> Dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # pip resolves against the runtime itself, nothing layered
    return env


def _missing_from_runtime(requirements_file: str, what: str) -> List[str]:
    """The exact `name==version`s pip would add to the runtime for the file, minus what the
    runtime has under any name (it is never replaced: the layer only adds)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        _run_pip(["install", "--dry-run", "--report", report, "-r", requirements_file], what)
        with open(report) as f:
            items = json.load(f).get("install", [])
    pins = []
    for item in items:
        meta = item.get("metadata", {})
        name, version = meta.get("name", ""), meta.get("version", "")
        aliases = _RUNTIME_ALIASES.get(_norm(name), (name,))
        have = [a for a in aliases if _installed_version(a)]
        if have:
            logger.warning(
                "%s: keeping the runtime's %s==%s (asked for %s==%s)",
                what,
                have[0],
                _installed_version(have[0]),
                name,
                version,
            )
            continue
        pins.append(f"{name}=={version}")
    return pins


def ensure(model_zoo: str, keras2: bool) -> Optional[str]:
    """The directory holding what the zoo needs beyond the runtime (installed on first use),
    or None when it needs nothing. Raises RuntimeEnvError."""
    requirements_file = os.path.join(model_zoo, "requirements.txt")
    requirements = read_requirements(requirements_file)
    needs_tf_keras = keras2 and importlib.util.find_spec("tf_keras") is None
    if not requirements and not needs_tf_keras:
        return None
    extra = [tf_keras_requirement()] if needs_tf_keras else []
    identity = {
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "tensorflow": tensorflow_version(),
        "extra": extra,
        "requirements": requirements,
    }
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]
    root = cache_root()
    env_dir = os.path.join(root, key)
    done = os.path.join(env_dir, "environment.json")
    if not os.path.isfile(done):
        try:
            os.makedirs(root, exist_ok=True)
            with open(os.path.join(root, key + ".lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one installer; the others wait and reuse it
                if not os.path.isfile(done):
                    _install(env_dir, identity, requirements_file if requirements else "", extra)
        except OSError as e:
            raise RuntimeEnvError(
                f"cannot write the model zoo's environment under {root}: {e.strerror or e}; "
                f"set {CACHE_ENV} to a writable directory"
            ) from None
    if env_dir not in sys.path:
        sys.path.append(env_dir)  # after the runtime: it adds packages, never replaces one
        importlib.invalidate_caches()
    return env_dir


def _install(env_dir: str, identity: dict, requirements_file: str, extra: List[str]) -> None:
    what = (
        f"the model zoo's requirements ({requirements_file})"
        if requirements_file
        else "tf-keras (the model uses tf.keras 2 APIs)"
    )
    pins = list(extra)
    if requirements_file:
        pins += _missing_from_runtime(requirements_file, what)
    tmp = env_dir + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    if pins:
        logger.info("Installing %s into %s (once; cached by content)", ", ".join(pins), env_dir)
        # --no-deps: the dependencies the runtime lacks are pinned above; tf-keras's own
        # `tensorflow` requirement is the runtime's tensorflow-cpu.
        _run_pip(["install", "--no-deps", "--target", tmp, *pins], what)
    with open(os.path.join(tmp, "environment.json"), "w") as f:
        json.dump({**identity, "installed": pins}, f, indent=1)
    shutil.rmtree(env_dir, ignore_errors=True)
    os.rename(tmp, env_dir)
