"""Training time a PS checkpoint blocks: the copy-on-write snapshot written by a forked child
against taking the checkpoint under the model lock, for tables of 10^5 to 10^7 rows.

    python benchmarks/checkpoint/bench_checkpoint.py [--rows 1e5,1e6,1e7] [--dim 8]
        [--optimizer Adam] [--repeats 3] [--dir DIR] [--push_ids 4096]

One PS shard in this process (the PS's own `Parameters`, `ParameterServer` and `Checkpointer`):
a table of ``rows`` rows of ``dim`` floats with the optimizer's slots (Adam: m and v), a dense
layer and its slots. A pusher thread applies sparse gradient pushes of ``--push_ids`` random
ids through `ParameterServer.push_gradients` all the time, as workers do. Per table size and
repeat, in turn:

* ``sync``: the whole save under the model lock: the shard as a message
  (`Parameters.to_model_pb`), serialized and written with fsync (`Checkpointer.save`), what a
  PS that saved synchronously would block. The baseline of the goal.
* ``copy``: the periodic save before the copy-on-write writer: the message built under the
  lock, written on a thread (`Checkpointer.save_async`).
* ``cow``: `Checkpointer.save_periodic`: the fork under the lock, the child writes.

Blocked: how long the checkpoint held the model lock (pushes wait for it). Stalled: what the
pushes that ran while the checkpoint was taken and written lost against the median push
before it (a copy-on-write write makes the PS copy each page it changes first: that cost is
here, not in "blocked"). Overhead: the memory the checkpoint added: for ``cow`` the child's
private memory at its end (pages the PS changed meanwhile plus the ids it collected), for the
others the message and its serialized bytes. Goal: ``cow`` blocked <= 5% of ``sync`` at the
largest table. Prints a table and one JSON line.

Memory: the table with Adam's slots is 3 x dim x 4 bytes a row (10^7 rows, dim 8: 0.9 GiB);
``sync`` and ``copy`` need about three times that again at their peak. A shard file must stay
under 2 GiB (protobuf's limit): at 10^7 rows use dim <= 16 with Adagrad or <= 8 with Adam.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "runtime"))
import common  # noqa: E402,F401  (puts the sources on the path)
import numpy as np  # noqa: E402
from elasticdl.common import tensor_utils as tu  # noqa: E402
from elasticdl.proto import elasticdl_pb2 as pb  # noqa: E402
from elasticdl.ps.checkpointer import STARTED, CheckpointConfig, Checkpointer  # noqa: E402
from elasticdl.ps.optimizer import Optimizer, parse_optimizer_config  # noqa: E402
from elasticdl.ps.parameters import Parameters  # noqa: E402
from elasticdl.ps.updater import ParameterServer  # noqa: E402
from interleaved import load_average  # noqa: E402

TABLE = "emb"
GOAL = 0.05
MODES = ("sync", "copy", "cow")


class UsageError(Exception):
    pass


def parse_rows(text: str) -> list[int]:
    try:
        rows = [int(float(v)) for v in text.split(",")]
    except ValueError:
        raise UsageError(f"--rows must be comma-separated numbers like 1e5,1e6, got {text!r}")
    if min(rows) <= 0:
        raise UsageError(f"--rows must be positive, got {text!r}")
    return rows


def build_shard(rows: int, dim: int, optimizer: str) -> ParameterServer:
    """A PS shard whose table has ``rows`` trained rows (each with the optimizer's slots)."""
    params = Parameters(0, 1)
    model = pb.Model(version=0)
    tu.ndarray_to_pb(np.zeros((256, 256), np.float32), model.dense_parameters["dense/kernel"])
    model.embedding_table_infos.add(name=TABLE, dim=dim, initializer="uniform")
    params.init_from_model_pb(model)
    ps = ParameterServer(params, Optimizer(parse_optimizer_config(optimizer, "learning_rate=0.01")))
    chunk = 1 << 20
    for start in range(0, rows, chunk):  # every row created and trained once
        ids = np.arange(start, min(rows, start + chunk), dtype=np.int64)
        push(ps, ids, dim)
    return ps


def push(ps: ParameterServer, ids: np.ndarray, dim: int) -> None:
    request = pb.PushGradientsRequest(gradients=pb.Model(version=ps.version))
    grads = np.full((ids.size, dim), 1e-3, np.float32)
    tu.indexed_rows_to_pb(tu.IndexedRows(grads, ids), request.gradients.embedding_tables[TABLE])
    tu.ndarray_to_pb(
        np.full((256, 256), 1e-3, np.float32), request.gradients.dense_parameters["dense/kernel"]
    )
    if not ps.push_gradients(request).accepted:
        raise RuntimeError("the PS refused a push")


class Pusher:
    """Pushes of random ids, all the time; records when each started and how long it took."""

    def __init__(self, ps: ParameterServer, rows: int, dim: int, batch: int) -> None:
        self.ps, self.rows, self.dim, self.batch = ps, rows, dim, batch
        self.pushes: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rng = np.random.default_rng(0)
        while not self._stop.is_set():
            ids = np.unique(rng.integers(0, self.rows, self.batch, dtype=np.int64))
            t0 = time.perf_counter()
            push(self.ps, ids, self.dim)
            self.pushes.append((t0, time.perf_counter() - t0))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def median_before(self, t: float, window: int = 20) -> float:
        before = [d for start, d in self.pushes if start < t][-window:]
        return statistics.median(before) if before else 0.0

    def stalled(self, t0: float, t1: float, baseline: float) -> float:
        """What the pushes that started or ended in [t0, t1] lost against ``baseline``."""
        return sum(max(0.0, d - baseline) for s, d in self.pushes if s + d >= t0 and s <= t1)


def measure(ps: ParameterServer, mode: str, directory: str, pusher: Pusher) -> dict:
    saver = Checkpointer(CheckpointConfig(directory, 1, 1), 0, 1)
    time.sleep(0.3)  # pushes before: the baseline push time
    baseline = pusher.median_before(time.perf_counter())
    t0 = time.perf_counter()
    overhead = 0
    with ps.lock:  # as the PS's version hook is called
        locked = time.perf_counter()
        if mode == "sync":
            model = ps.params.to_model_pb()
            saver.save(model)
            overhead = model.ByteSize() * 2  # the message and its serialized bytes
            del model
        elif mode == "copy":
            model = ps.params.to_model_pb()
            future = saver.save_async(model)
            overhead = model.ByteSize() * 2
            del model
        else:
            if saver.save_periodic(ps.params) != STARTED:
                raise RuntimeError("the copy-on-write writer did not start")
        blocked = time.perf_counter() - locked
    if mode == "copy":
        future.result()
    saver.flush()
    t1 = time.perf_counter()
    result = {"blocked_s": blocked, "total_s": t1 - t0}
    if mode == "cow":
        written = saver.written[-1]
        if not written.ok:
            raise RuntimeError(written.error)
        result["blocked_s"] = written.blocked_s
        overhead = written.overhead_bytes
    result["overhead_mib"] = overhead / 2**20
    time.sleep(0.2)  # the push that waited for the lock has ended and is recorded
    result["stalled_s"] = pusher.stalled(t0, t1, baseline)
    result["push_ms"] = baseline * 1e3
    saver.close()
    return result


def run(args) -> dict:
    results = {}
    for rows in args.rows:
        ps = build_shard(rows, args.dim, args.optimizer)
        mib = 4 * rows * args.dim * (1 + len(ps.optimizer.slot_names)) / 2**20
        pusher = Pusher(ps, rows, args.dim, args.push_ids)
        runs = {m: [] for m in MODES}
        with tempfile.TemporaryDirectory(dir=args.dir) as directory:
            for _ in range(args.repeats):  # interleaved: a change of load hits every mode alike
                for mode in MODES:
                    runs[mode].append(measure(ps, mode, directory, pusher))
        pusher.stop()
        med = {m: {k: statistics.median(r[k] for r in runs[m]) for k in runs[m][0]} for m in MODES}
        results[rows] = {"table_mib": mib, **med}
        del ps, pusher
    return results


def report(args, results: dict, load_before: list) -> dict:
    print(
        f"{'rows':>10} {'MiB':>7} | {'sync s':>7} {'copy blocked s':>14} {'cow blocked ms':>14} "
        f"{'cow/sync':>8} | {'cow write s':>11} {'cow stalled s':>13} {'cow extra MiB':>13} "
        f"{'copy extra MiB':>14}"
    )
    for rows, r in results.items():
        ratio = r["cow"]["blocked_s"] / r["sync"]["blocked_s"]
        print(
            f"{rows:>10} {r['table_mib']:>7.0f} | {r['sync']['blocked_s']:>7.2f} "
            f"{r['copy']['blocked_s']:>14.2f} {r['cow']['blocked_s'] * 1e3:>14.1f} {ratio:>8.4f} | "
            f"{r['cow']['total_s']:>11.2f} {r['cow']['stalled_s']:>13.2f} "
            f"{r['cow']['overhead_mib']:>13.0f} {r['copy']['overhead_mib']:>14.0f}"
        )
    largest = results[max(results)]
    ratio = largest["cow"]["blocked_s"] / largest["sync"]["blocked_s"]
    summary = {
        "benchmark": "ps_checkpoint_blocking",
        "rows": list(results),
        "dim": args.dim,
        "optimizer": args.optimizer,
        "repeats": args.repeats,
        "per_rows": {str(k): v for k, v in results.items()},
        "cow_over_sync_blocked_at_largest": ratio,
        "goal": GOAL,
        "goal_met": ratio <= GOAL,
        "load_before": load_before,
        "load_after": load_average(),
    }
    print(json.dumps(summary))
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1e5,1e6,1e7")
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--optimizer", default="Adam")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--push_ids", type=int, default=4096)
    parser.add_argument("--dir", default=None, help="where checkpoints go (default: the temp dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        args.rows = parse_rows(args.rows)
        if args.repeats < 1 or args.dim < 1 or args.push_ids < 1:
            raise UsageError("--repeats, --dim and --push_ids must be positive")
    except UsageError as e:
        print(f"bench_checkpoint: error: {e}", file=sys.stderr)
        return 2
    load_before = load_average()
    report(args, run(args), load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
