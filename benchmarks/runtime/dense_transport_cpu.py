"""Dense transport CPU: the README model's trainer and one PS per transport, CPU and wall per
minibatch, against the same-host path measured in the same run.

    python benchmarks/runtime/dense_transport_cpu.py [--minibatches 400] [--warmup 50]
        [--repeats 5] [--transports shared_memory,messages,grpc]

The README's model (model_zoo mnist.mnist_functional_api.custom_model, about 0.9 MB of dense
parameters) trains on Fashion-MNIST minibatches of 64 held in memory, so neither side pays its
feed, nor a master. `PSTrainer.train_minibatch` runs in sync mode against a fresh `python -m
elasticdl.ps.main` on 127.0.0.1 per run. The transports are those of a job:
- shared_memory: the same-host path.
- messages: the tensors in the PS's stream channel's frames, as between hosts.
- grpc: those messages as gRPC calls.
Every repeat runs each transport once, in an order that rotates from repeat to repeat.

Reported per minibatch, as the medians of the repeats:
- the wall time;
- the CPU of the worker's main thread;
- the CPU of the worker process, TensorFlow's threads included;
- the CPU of the PS process.
Also per transport: the same-host path's wall time over this transport's, paired per repeat
(job_overhead.py's "messages / shared memory", without the feed and the master). CPU moves
far less with the machine's other load than wall time. The load average is recorded before
and after. Prints a table, then a JSON line.
"""
from __future__ import annotations

import argparse
import os
import secrets
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (benchmarks are scripts, not a package)
import cpu_per_minibatch  # noqa: E402

MODEL_DEF = "mnist.mnist_functional_api.custom_model"
MINIBATCH = 64
# The PS client's switches per transport.
TRANSPORTS = {
    "shared_memory": {"shared_memory": True, "stream_channel": False},
    "messages": {"shared_memory": False, "stream_channel": True},
    "grpc": {"shared_memory": False, "stream_channel": False},
}
KEYS = ("wall_ms", "main_thread_cpu_ms", "cpu_ms", "server_cpu_ms")


def load_minibatches(data_dir: str, count: int) -> list:
    """`count` training minibatches of the README model's feed, in memory."""
    import tensorflow as tf
    from elasticdl.common.model_utils import Mode, load_model_spec
    from elasticdl.data.reader import create_data_reader

    spec = load_model_spec(common.MODEL_ZOO, MODEL_DEF)
    reader = create_data_reader(os.path.join(data_dir, "train"), records_per_task=None)
    records = []
    for shard in reader.create_shards():
        records.extend(reader.read_records(shard.name, shard.start, shard.end))
        if len(records) >= count * MINIBATCH:
            break
    if len(records) < count * MINIBATCH:
        raise SystemExit(f"the training data holds {len(records)} records, fewer than {count} x 64")
    ds = tf.data.Dataset.from_tensor_slices(records[: count * MINIBATCH])
    ds = spec.feed(ds, Mode.TRAINING, None).batch(MINIBATCH, drop_remainder=True)
    return list(ds)


def measure(transport: str, batches: list, warmup: int) -> dict:
    """One run: a fresh PS, `warmup` untimed minibatches, then the rest timed."""
    from elasticdl.common.model_utils import load_model_spec
    from elasticdl.worker.ps_client import PSClient, wait_for_ps
    from elasticdl.worker.ps_trainer import PSTrainer

    spec = load_model_spec(common.MODEL_ZOO, MODEL_DEF)
    secret = secrets.token_hex(16)
    ps = cpu_per_minibatch.PSProcess(spec, False, MINIBATCH, secret)
    client = None
    try:
        client = PSClient([f"127.0.0.1:{ps.port}"], secret=secret, **TRANSPORTS[transport])
        wait_for_ps(client, 60)
        trainer = PSTrainer(spec, client)
        for features, labels in batches[:warmup]:
            trainer.train_minibatch(features, labels)
        timed = batches[warmup:]

        def run():
            for features, labels in timed:
                trainer.train_minibatch(features, labels)

        out = cpu_per_minibatch._timed(run, len(timed), pids=[ps.proc.pid])
        out["steps"] = trainer.steps
        out["shared_memory"] = bool(client.shared_memory_ps())
        out["stream"] = any(link.stream is not None for link in client._links)
        return out
    finally:
        if client is not None:
            client.close()
        ps.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--data",
        default=common.DEFAULT_CACHE,
        help="prepared Fashion-MNIST directory (prepared there if missing)",
    )
    p.add_argument("--warmup", type=int, default=50, help="untimed minibatches first")
    p.add_argument("--minibatches", type=int, default=400, help="timed minibatches")
    p.add_argument("--repeats", type=int, default=5, help="every transport once per repeat")
    p.add_argument(
        "--transports",
        default="shared_memory,messages,grpc",
        help=f"of {','.join(TRANSPORTS)}; shared_memory, the baseline, is always measured",
    )
    args = p.parse_args(argv)
    named = [t.strip() for t in args.transports.split(",") if t.strip()]
    if not named or set(named) - set(TRANSPORTS) or len(set(named)) != len(named):
        p.error(f"--transports must name some of {','.join(TRANSPORTS)} once each")
    if args.warmup < 1 or args.minibatches < 1 or args.repeats < 1:
        p.error("--warmup, --minibatches and --repeats must be >= 1")
    transports = ["shared_memory"] + [t for t in named if t != "shared_memory"]

    batches = load_minibatches(
        common.prepare_fashion_mnist(args.data), args.warmup + args.minibatches
    )
    load_before = os.getloadavg()
    runs = {t: [] for t in transports}
    rows = []
    for r in range(args.repeats):
        shift = r % len(transports)
        for transport in transports[shift:] + transports[:shift]:
            run = measure(transport, batches, args.warmup)
            runs[transport].append(run)
            rows.append([r + 1, transport] + [run[k] for k in KEYS])
    load_after = os.getloadavg()

    summary = {
        "benchmark": "dense_transport_cpu",
        "cpus": os.cpu_count(),
        "minibatch_size": MINIBATCH,
        "minibatches": args.minibatches,
        "repeats": args.repeats,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
    }
    baseline = runs["shared_memory"]
    for transport, measured in runs.items():
        for key in KEYS:
            name = {"cpu_ms": "worker_cpu_ms", "server_cpu_ms": "ps_cpu_ms"}.get(key, key)
            summary[f"{transport}_{name}"] = round(common.median([m[key] for m in measured]), 3)
        summary[f"{transport}_steps"] = measured[-1]["steps"]
        summary[f"{transport}_path"] = (
            "shared memory"
            if measured[-1]["shared_memory"]
            else "stream"
            if measured[-1]["stream"]
            else "grpc"
        )
        paired = [b["wall_ms"] / m["wall_ms"] for b, m in zip(baseline, measured)]
        summary[f"{transport}_vs_shared_memory"] = round(common.median(paired), 3)
    common.print_table(
        f"ms per minibatch of {MINIBATCH}, README model, 1 worker + 1 PS (sync), "
        f"{args.minibatches} timed minibatches (load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after)",
        ["repeat", "transport", "wall", "main thread CPU", "worker CPU", "PS CPU"],
        rows,
    )
    for transport in transports[1:]:
        print(
            f"{transport}: shared memory's wall / its own {summary[f'{transport}_vs_shared_memory']}"
            f" (median of paired repeats)"
        )
    common.print_json(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
