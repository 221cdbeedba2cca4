"""Shared helpers of the runtime benchmarks: data preparation, statistics, result printing."""
from __future__ import annotations

import json
import os
import socket
import statistics
import sys
from typing import Dict, List, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL_ZOO = os.path.join(REPO, "model_zoo")
DEFAULT_CACHE = os.path.join(
    os.path.expanduser("~"), ".cache", "elasticdl", "bench", "fashion_mnist"
)

# Run from a checkout without installing anything: the sources and the model zoo come first.
for _path in (MODEL_ZOO, os.path.join(REPO, "src", "python")):
    if _path not in sys.path:
        sys.path.insert(0, _path)


def python_env() -> Dict[str, str]:
    """Environment for child processes: the repository's sources and model zoo importable."""
    env = dict(os.environ)
    paths = [os.path.join(REPO, "src", "python"), MODEL_ZOO]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def prepare_fashion_mnist(output_dir: str = DEFAULT_CACHE) -> str:
    """The Fashion-MNIST RecordIO shards (prepared once, then reused from the cache)."""
    from elasticdl.data.datasets import prepare

    prepare("fashion_mnist", output_dir, progress=False)
    return output_dir


def subset_dir(train_dir: str, num_files: int, out_dir: str) -> str:
    """A directory holding symlinks to the first ``num_files`` shard files of ``train_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    names = sorted(n for n in os.listdir(train_dir) if not n.startswith("."))[:num_files]
    for name in names:
        link = os.path.join(out_dir, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join(train_dir, name), link)
    return out_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def print_table(title: str, header: Sequence[str], rows: List[Sequence]) -> None:
    cells = [list(map(str, header))] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(title)
    for i, row in enumerate(cells):
        print("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths)))
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))
    sys.stdout.flush()


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.0f}"
    return str(value)


def print_json(summary: dict) -> None:
    print(json.dumps(summary, sort_keys=True))
    sys.stdout.flush()
