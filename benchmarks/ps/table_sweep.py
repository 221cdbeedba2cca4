"""Table size sweep: one embedding table of vocab x dim rows trained with Adam, split over 1, 2
and 4 PS processes: the PS's resident memory per row against the raw bytes, and rows/s.

    python benchmarks/ps/table_sweep.py [--vocabs 1e5,1e6,1e7,1e8] [--max_vocab 1e7]
        [--ps 1,2,4] [--dim 16] [--batch 65536] [--repeats 5] [--budget_gib 20] [--plot out.png]

Per (PS count, vocab): that many real PS processes (`python -m elasticdl.ps.main`, Adam,
asynchronous, 127.0.0.1) and the worker's `PSClient`. The model is pushed (one table, rows
created lazily as in training), then every row is trained once (pushes of --fill_chunk ids in
order: each creates its rows, with Adam's m and v, and applies the step), then --repeats pulls
and pushes of --batch unique random ids are timed (Adam on the pushed rows).

The table's vocabulary goes to the PS with the model, as a worker's does (the layer's
input_dim): a table whose share cannot fit in a PS's memory is refused before any row exists
(elasticdl/ps/memory_fit.py), and the point is reported as refused with the PS's message.

Memory: each PS's RSS from /proc (VmRSS after the fill, VmHWM for the peak) minus its RSS
with the model pushed and the table empty, summed over the PS, per row. Raw bytes per row:
the row and the optimizer's slots, (1 + 2) x dim x 4 for Adam (target: RSS <= 1.3x that).
The largest table within --budget_gib is projected from the largest vocab measured: the budget
less the PS's empty RSS, over the peak bytes per row (say so when it was not measured).

--max_vocab drops larger vocabs (10^8 rows with Adam need ~19 GiB raw; on a shared machine run
at most 10^7). Prints a table and a JSON line; --plot writes the curves as a PNG.
"""
from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "runtime"))
import common  # noqa: E402  (puts the sources on the path)

TABLE = "emb"
TARGET_RATIO = 1.3
ADAM_SLOTS = 2  # m and v
GIB = 1 << 30


class UsageError(Exception):
    pass


def parse_counts(text: str, flag: str) -> list[int]:
    try:
        values = [int(float(v)) for v in text.split(",")]
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated numbers like 1e5,1e6, got {text!r}")
    if min(values) <= 0:
        raise UsageError(f"{flag} must be positive, got {text!r}")
    return values


def _proc_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {key}")


class PSGroup:
    """`n` PS processes of one job and a worker's client to them."""

    def __init__(self, n: int, dim: int, minibatch: int, vocab: int):
        from elasticdl.common import auth
        from elasticdl.worker.ps_client import EmbeddingTableInfo, PSClient, wait_for_ps

        secret = secrets.token_hex(16)
        env = dict(common.python_env(), **{auth.JOB_SECRET_ENV: secret})
        ports = [common.free_port() for _ in range(n)]
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "elasticdl.ps.main",
                    f"--ps_id={i}",
                    f"--num_ps_pods={n}",
                    f"--port={port}",
                    "--bind_host=127.0.0.1",
                    "--opt_type=Adam",
                    "--opt_args=learning_rate=0.001;",
                    "--use_async=true",
                    f"--minibatch_size={minibatch}",
                    "--log_level=WARNING",
                ],
                env=env,
            )
            for i, port in enumerate(ports)
        ]
        self.client = PSClient(
            [f"127.0.0.1:{p}" for p in ports], secret=secret, shared_memory=False
        )
        try:
            wait_for_ps(self.client, 60)
            import numpy as np

            self.client.push_model(
                {"bias": np.zeros(1, np.float32)},
                [EmbeddingTableInfo(TABLE, dim, "uniform", vocabulary=vocab)],
            )
        except BaseException:
            self.close()
            raise

    def rss_kib(self, key: str = "VmRSS") -> list[int]:
        return [_proc_kib(p.pid, key) for p in self.procs]

    def close(self) -> None:
        self.client.close()
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def measure(num_ps: int, vocab: int, args) -> dict:
    import grpc
    import numpy as np

    try:
        group = PSGroup(num_ps, args.dim, args.fill_chunk, vocab)
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.INVALID_ARGUMENT:
            raise
        return {"ps": num_ps, "vocab": vocab, "refused": err.details()}
    try:
        empty = group.rss_kib()
        grads = np.full((args.fill_chunk, args.dim), 1e-3, np.float32)
        start = time.perf_counter()
        for first in range(0, vocab, args.fill_chunk):
            ids = np.arange(first, min(vocab, first + args.fill_chunk), dtype=np.int64)
            res = group.client.push_gradients({}, {TABLE: (grads[: ids.size], ids)})
            assert res.accepted
        fill_s = time.perf_counter() - start
        filled, peak = group.rss_kib(), group.rss_kib("VmHWM")
        rng = np.random.default_rng(vocab + num_ps)
        batch = min(args.batch, vocab)
        pulls, pushes = [], []
        for _ in range(args.repeats):
            ids = np.unique(rng.integers(0, vocab, batch, dtype=np.int64))
            t = time.perf_counter()
            rows = group.client.pull_embedding_vectors(TABLE, ids, args.dim, ids_unique=True)
            pulls.append(ids.size / (time.perf_counter() - t))
            assert rows.shape == (ids.size, args.dim)
            t = time.perf_counter()
            group.client.push_gradients({}, {TABLE: (grads[: ids.size], ids)})
            pushes.append(ids.size / (time.perf_counter() - t))
        raw = (1 + ADAM_SLOTS) * args.dim * 4
        per_row = (sum(filled) - sum(empty)) * 1024 / vocab
        peak_per_row = (sum(peak) - sum(empty)) * 1024 / vocab
        return {
            "ps": num_ps,
            "vocab": vocab,
            "dim": args.dim,
            "raw_bytes_per_row": raw,
            "rss_bytes_per_row": per_row,
            "peak_bytes_per_row": peak_per_row,
            "rss_ratio": per_row / raw,
            "peak_ratio": peak_per_row / raw,
            "empty_rss_mib": sum(empty) / 1024,
            "rss_mib": sum(filled) / 1024,
            "peak_rss_mib": sum(peak) / 1024,
            "fill_rows_per_s": vocab / fill_s,
            "pull_rows_per_s": common.median(pulls),
            "push_rows_per_s": common.median(pushes),
            "batch": batch,
        }
    finally:
        group.close()


def plot(points: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, n in enumerate(sorted({p["ps"] for p in points})):
        pts = [p for p in points if p["ps"] == n]
        xs = [p["vocab"] for p in pts]
        c = f"C{i}"
        ax1.plot(xs, [p["rss_ratio"] for p in pts], c=c, marker="o", label=f"{n} PS, resident")
        ax1.plot(
            xs, [p["peak_ratio"] for p in pts], c=c, marker="x", ls="--", label=f"{n} PS, peak"
        )
        ax2.plot(xs, [p["pull_rows_per_s"] for p in pts], c=c, marker="o", label=f"{n} PS, pull")
        ax2.plot(
            xs, [p["push_rows_per_s"] for p in pts], c=c, marker="x", ls="--", label=f"{n} PS, push"
        )
    ax1.axhline(TARGET_RATIO, color="grey", linestyle=":", label="target 1.3")
    ax1.set_ylabel("PS bytes per row / raw (row + Adam m, v)")
    ax1.set_title("memory per row")
    ax2.set_ylabel("rows/s")
    ax2.set_yscale("log")
    ax2.set_title("pull and push (Adam) of a batch of unique ids")
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_xlabel("vocab (rows)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocabs", default="1e5,1e6,1e7,1e8")
    p.add_argument("--max_vocab", default="1e8")
    p.add_argument("--ps", default="1,2,4")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=65536)
    p.add_argument("--fill_chunk", type=int, default=262144)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--budget_gib", type=float, default=20.0)
    p.add_argument("--plot", default="")
    args = p.parse_args(argv)
    try:
        args.max_vocab = parse_counts(args.max_vocab, "--max_vocab")[0]
        args.all_vocabs = parse_counts(args.vocabs, "--vocabs")
        args.ps = parse_counts(args.ps, "--ps")
    except UsageError as e:
        p.error(str(e))
    args.vocabs = [v for v in args.all_vocabs if v <= args.max_vocab]
    for flag in ("dim", "batch", "fill_chunk", "repeats"):
        if getattr(args, flag) <= 0:
            p.error(f"--{flag} must be positive, got {getattr(args, flag)}")
    if not args.vocabs:
        p.error(f"--max_vocab {args.max_vocab} leaves none of --vocabs {args.all_vocabs}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    measured = [measure(n, v, args) for n in args.ps for v in args.vocabs]
    points = [p for p in measured if "refused" not in p]
    refused = [p for p in measured if "refused" in p]
    common.print_table(
        f"Table size sweep, dim {args.dim}, Adam (raw = row + m + v = "
        f"{(1 + ADAM_SLOTS) * args.dim * 4} B/row)",
        (
            "PS",
            "vocab",
            "B/row",
            "ratio",
            "peak B/row",
            "peak ratio",
            "RSS MiB",
            "fill rows/s",
            "pull rows/s",
            "push rows/s",
        ),
        [
            (
                p["ps"],
                p["vocab"],
                p["rss_bytes_per_row"],
                p["rss_ratio"],
                p["peak_bytes_per_row"],
                p["peak_ratio"],
                p["rss_mib"],
                p["fill_rows_per_s"],
                p["pull_rows_per_s"],
                p["push_rows_per_s"],
            )
            for p in points
        ],
    )
    for p in refused:
        print(f"{p['ps']} PS, vocab {p['vocab']:,}: refused before training: {p['refused']}")
    if args.plot and points:
        plot(points, args.plot)
    largest = max((p["vocab"] for p in points), default=0)
    budget = {}
    for n in args.ps:
        p = max((q for q in points if q["ps"] == n), key=lambda q: q["vocab"], default=None)
        if p is not None:
            room = args.budget_gib * GIB - p["empty_rss_mib"] * (1 << 20)
            budget[str(n)] = int(room / p["peak_bytes_per_row"])
    at_largest = [p for p in points if p["vocab"] == largest]
    common.print_json(
        {
            "benchmark": "ps_table_sweep",
            "dim": args.dim,
            "optimizer": "Adam",
            "points": points,
            "vocabs_run": args.vocabs,
            "vocabs_not_run": [v for v in args.all_vocabs if v > args.max_vocab],
            "refused": refused,
            "max_rss_ratio": max((p["rss_ratio"] for p in points), default=None),
            "max_rss_ratio_at_largest": max((p["rss_ratio"] for p in at_largest), default=None),
            "target_ratio": TARGET_RATIO,
            "targets_met": bool(at_largest)
            and max(p["rss_ratio"] for p in at_largest) <= TARGET_RATIO,
            "budget_gib": args.budget_gib,
            # Projected from the largest vocab measured per PS count (its peak bytes per row).
            "largest_vocab_in_budget_projected": budget,
            "largest_vocab_measured": largest,
            "load_average": os.getloadavg()[0],
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
