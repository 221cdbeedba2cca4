r"""The test tiers of the suite: which tier a test file belongs to, which tiers the repository
has, and the Pants specs that leave a tier out of a run.

A tier is a directory of integration tests under ``tests/python/elasticdl_tests/`` (its name
with ``-`` for ``_``: ``k8s``, ``k8s-node``, ``images`` ...), ``unit`` for the tests beside
the code in ``src/python`` and ``model_zoo``, and ``benchmarks``. A few slow files are a tier
of their own so that they can be reported and left out on their own (``gpu-image``). The CI
helpers' own tests (``scripts/``) count as ``unit``.

    python3 scripts/ci/tiers.py exclude-specs k8s-node,gpu-image
        # -tests/python/elasticdl_tests/k8s_node::
        # --filter-address-regex=-^(?:tests/python/elasticdl_tests/images/gpu_image_test\.py):
    python3 scripts/ci/tiers.py specs k8s,k8s-node
        # tests/python/elasticdl_tests/k8s:: tests/python/elasticdl_tests/k8s_node::
    python3 scripts/ci/tiers.py list

The tiers that need the Kubernetes binaries (scripts/k8s/build-*.sh) are KUBERNETES_TIERS:
scripts/run-tests.sh runs the others while a fresh machine builds them.
"""
from __future__ import annotations

import fnmatch
import os
import re
import sys
from pathlib import Path

INTEGRATION_ROOT = "tests/python/elasticdl_tests/"
# Files that are a tier by themselves (checked before the directory rule).
OWN_TIER_FILES = {
    "tests/python/elasticdl_tests/images/gpu_image_test.py": "gpu-image",
}
# Other source roots with tests, and the tier their tests belong to.
ROOT_TIERS = {
    "src/python/": "unit",
    "model_zoo/": "unit",
    "scripts/": "unit",
    "benchmarks/": "benchmarks",
}
TEST_PATTERNS = ("*_test.py", "test_*.py")
_SKIP_DIRS = {".git", ".pants.d", ".pants-tools", "dist", "__pycache__", ".venv"}


KUBERNETES_TIERS = ("k8s", "k8s-node")


class UnknownTier(ValueError):
    pass


def tier_of(path: str) -> str:
    """The tier of the test file at ``path`` (relative to the repository root)."""
    path = path.replace(os.sep, "/").removeprefix("./")
    if path in OWN_TIER_FILES:
        return OWN_TIER_FILES[path]
    if path.startswith(INTEGRATION_ROOT):
        rest = path[len(INTEGRATION_ROOT) :]
        if "/" in rest:
            return rest.split("/", 1)[0].replace("_", "-")
        return "integration"  # a test file directly in elasticdl_tests/
    for prefix, tier in ROOT_TIERS.items():
        if path.startswith(prefix):
            return tier
    return path.split("/", 1)[0] or "other"


def test_files(root: Path) -> list[str]:
    """Every test file of the repository, relative to ``root``, sorted."""
    found = []
    for top in ("src/python", "tests/python", "model_zoo", "benchmarks", "scripts"):
        for dirpath, dirnames, filenames in os.walk(root / top):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
            for name in filenames:
                if any(fnmatch.fnmatch(name, p) for p in TEST_PATTERNS):
                    found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(p.replace(os.sep, "/") for p in found)


def all_tiers(root: Path) -> dict[str, list[str]]:
    """Tier name -> its test files, for every tier the repository has."""
    tiers: dict[str, list[str]] = {}
    for path in test_files(root):
        tiers.setdefault(tier_of(path), []).append(path)
    return tiers


def parse_names(value: str) -> list[str]:
    """``ELASTICDL_CI_SKIP_TIERS``: names separated by commas or spaces."""
    return [n for n in value.replace(",", " ").split() if n]


def check_names(names: list[str], known: dict[str, list[str]]) -> None:
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UnknownTier(
            f"ELASTICDL_CI_SKIP_TIERS: unknown tier {unknown[0]!r}; the tiers are "
            + ", ".join(sorted(known))
        )


def exclude_specs(names: list[str], known: dict[str, list[str]]) -> list[str]:
    """Arguments that leave the tiers ``names`` out of ``./pants test``: ignore specs
    (``-dir::``) for directories, ``--filter-address-regex`` for single files (an ignore spec
    naming one file does not drop its test target from ``./pants test ::``)."""
    found = specs(names, known)
    files = [s for s in found if s.endswith(".py")]
    out = ["-" + s for s in found if not s.endswith(".py")]
    if files:
        out.append(_leave_out(files))
    return out


def _leave_out(files: list[str]) -> str:
    names = "|".join(re.escape(f) for f in files)
    return f"--filter-address-regex=-^(?:{names}):"


def specs(names: list[str], known: dict[str, list[str]]) -> list[str]:
    """Pants specs of the tiers ``names``; tiers the repository does not have are errors."""
    check_names(names, known)
    specs = []
    for name in names:
        own = [f for f, t in OWN_TIER_FILES.items() if t == name]
        if own:
            specs += own
            continue
        directory = {d.replace("_", "-"): d for d in _integration_dirs(known[name])}.get(name)
        if directory is not None:
            specs.append(f"{INTEGRATION_ROOT}{directory}::")
        else:  # unit, benchmarks: their files one by one would be long; their roots instead
            specs += [p.rstrip("/") + "::" for p, t in ROOT_TIERS.items() if t == name]
    return specs


def _integration_dirs(files: list[str]) -> set[str]:
    return {
        f[len(INTEGRATION_ROOT) :].split("/", 1)[0]
        for f in files
        if f.startswith(INTEGRATION_ROOT) and "/" in f[len(INTEGRATION_ROOT) :]
    }


def main(argv: list[str], root: Path | None = None) -> int:
    root = root or Path(__file__).resolve().parents[2]
    if argv[:1] == ["list"]:
        for name, files in sorted(all_tiers(root).items()):
            print(f"{name}\t{len(files)}")
        return 0
    if argv == ["kubernetes-tiers"]:
        print(",".join(KUBERNETES_TIERS))
        return 0
    if argv[:1] in (["specs"], ["exclude-specs"]) and len(argv) <= 2:
        make = specs if argv[0] == "specs" else exclude_specs
        try:
            print(" ".join(make(parse_names(" ".join(argv[1:])), all_tiers(root))))
        except UnknownTier as e:
            print(f"tiers: error: {e}", file=sys.stderr)
            return 2
        return 0
    print(
        "usage: tiers.py list | specs NAME[,NAME...] | exclude-specs NAME[,NAME...]",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
