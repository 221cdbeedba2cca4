"""Sparse job vs plain loop: DeepFM on synthetic_ctr with its embedding table on 1 and 2 PS,
against a single-process Keras loop with a Keras Embedding of the same size, same run.

    python benchmarks/runtime/sparse_job.py [--rows 500000] [--features 26] [--vocab 38462]
        [--zipf 1.1] [--ps 1,2] [--modes sync,async] [--minibatch_size 256] [--plot out.png]
        [--loop_feed per_record|batched]

Data: `elasticdl dataset prepare synthetic_ctr` with the given flags (cached under
~/.cache/elasticdl/bench), whose manifest holds the hidden model's AUC on the test split (the
ceiling). Model: `deepfm.deepfm_ctr.custom_model`, one table of features x vocab rows x 8
(plus a first-order table of 1 column), Adam(0.001) (`--optimizer sgd`: SGD(0.05)). The job is
`elasticdl train --platform=local`, 1 worker + N PS as separate processes (gRPC over
127.0.0.1), timed in steady state from the master's `get_job_status` after `--warmup_records`,
then the final evaluation's AUC on the test
split. `--modes sync,async` runs every job twice, with the PS in sync mode (the default) and
with `--use_async` (the worker then overlaps each push with the next step), interleaved in
the same repeat. The baseline is the same model with `keras.layers.Embedding` (embedding="keras"), the
same feed, minibatch and optimizer, a `tf.function` step in one process, then the same AUC
metric on the test split. Prints a table and a JSON line (ratio = job / baseline samples/s;
target >= 1.0 at 10^6 rows, and AUC within 0.005 of the loop's); with `--repeats`, medians and
the ratio to the loop's fastest run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

MODEL_DEF = "deepfm.deepfm_ctr.custom_model"
TARGET_RATIO = 1.0
TARGET_AUC_GAP = 0.005
# --optimizer -> the model file's optimizer function. Keras' Adam densifies an Embedding's
# gradient and updates every row each step; its SGD updates only the batch's rows.
OPTIMIZERS = {"adam": "optimizer", "sgd": "sgd_optimizer"}


def prepare_data(args) -> str:
    from elasticdl.data.datasets import prepare

    out = args.data or os.path.join(
        os.path.expanduser("~"),
        ".cache",
        "elasticdl",
        "bench",
        f"synthetic_ctr-r{args.rows}-f{args.features}-v{args.vocab}-z{args.zipf:g}-s{args.seed}",
    )
    params = dict(
        rows=args.rows, features=args.features, vocab=args.vocab, zipf=args.zipf, seed=args.seed
    )
    prepare("synthetic_ctr", out, progress=False, params=params)
    return out


def _auc_ceiling(data: str) -> float:
    with open(os.path.join(data, ".elasticdl-dataset.json")) as f:
        return float(json.load(f)["metadata"]["test"]["auc_ceiling"])


# ---------------------------------------------------------------------------------------- baseline
def model_spec(args, embedding: str = ""):
    """The benchmark's DeepFM spec: `embedding="keras"` for the loop, "" for the job's."""
    from elasticdl.common.model_utils import load_model_spec

    params = f"features={args.features}; vocab={args.vocab}"
    if embedding:
        params += f"; embedding='{embedding}'"
    return load_model_spec(
        common.MODEL_ZOO, MODEL_DEF, model_params=params, optimizer=OPTIMIZERS[args.optimizer]
    )


def minibatches(spec, directory: str, mode, minibatch_size: int, loop_feed: str = "per_record"):
    """The loop's feed: every record of `directory` through the spec's `feed`, in minibatches.
    `loop_feed="batched"`: the feed's maps over whole minibatches of records, as the worker
    runs them (`elasticdl.worker.batched_feed`), for a loop written with a batched parse."""
    import tensorflow as tf
    from elasticdl.data.reader import create_data_reader
    from elasticdl.worker.batched_feed import BatchedFeed

    reader = create_data_reader(directory, records_per_task=None)
    records = []
    for shard in reader.create_shards():
        records.extend(reader.read_records(shard.name, shard.start, shard.end))
    ds = tf.data.Dataset.from_tensor_slices(records)
    fed = spec.feed(ds, mode, None)
    if loop_feed == "batched":
        batched, why = BatchedFeed.of(fed, ds)
        if batched is None:
            raise SystemExit(f"--loop_feed=batched: the model's feed cannot run batched ({why})")
        return ds.batch(minibatch_size).map(batched).prefetch(1)
    return fed.batch(minibatch_size).prefetch(1)


def keras_step(spec):
    """The plain loop's model and its compiled training step (features, labels) -> loss."""
    import tensorflow as tf

    model = spec.model_fn()
    optimizer = spec.optimizer()

    @tf.function(reduce_retracing=True)
    def step(features, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(spec.loss(labels, model(features, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return model, step


def run_baseline(args) -> dict:
    """The plain Keras loop, in this process (a child of the driver)."""
    import tensorflow as tf
    from elasticdl.common.model_utils import Mode

    spec = model_spec(args, embedding="keras")

    def dataset(directory, mode):
        return minibatches(spec, directory, mode, args.minibatch_size, args.loop_feed)

    model, step = keras_step(spec)
    seen = counted = 0
    start = None
    for features, labels in dataset(os.path.join(args.data, "train"), Mode.TRAINING):
        loss = step(features, labels)
        n = int(labels.shape[0])
        seen += n
        if start is None:
            if seen >= args.warmup_records:
                float(loss)
                start = time.perf_counter()
            continue
        counted += n
    float(loss)
    elapsed = time.perf_counter() - start
    metric = spec.eval_metrics_fn()["auc"]
    predict = tf.function(lambda f: model(f, training=False))
    for features, labels in dataset(os.path.join(args.data, "test"), Mode.EVALUATION):
        metric.update_state(labels, predict(features))
    return {
        "records": seen,
        "timed_records": counted,
        "seconds": elapsed,
        "samples_per_s": counted / elapsed,
        "auc": float(metric.result()),
    }


def baseline_in_child(args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "_baseline", "--data", args.data]
    cmd += _shared_flags(args)
    out = subprocess.run(cmd, env=common.python_env(), capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"baseline failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _shared_flags(args) -> list:
    return [
        f"--features={args.features}",
        f"--vocab={args.vocab}",
        f"--minibatch_size={args.minibatch_size}",
        f"--warmup_records={args.warmup_records}",
        f"--optimizer={args.optimizer}",
        f"--loop_feed={args.loop_feed}",
    ]


# --------------------------------------------------------------------------------------------- job
MODES = ("sync", "async")


def job_key(num_ps: int, mode: str) -> str:
    """The summary's key of a job: `1ps` (sync, as before there were modes), `1ps_async`."""
    return f"{num_ps}ps" + ("" if mode == "sync" else f"_{mode}")


def run_job(args, home: str, name: str, num_ps: int, mode: str = "sync") -> dict:
    submitted = time.time()
    job_dir = common.submit_local_job(
        home,
        name,
        [
            f"--model_def={MODEL_DEF}",
            f"--model_params=features={args.features}; vocab={args.vocab}",
            f"--optimizer={OPTIMIZERS[args.optimizer]}",
            f"--training_data={os.path.join(args.data, 'train')}",
            f"--validation_data={os.path.join(args.data, 'test')}",
            "--num_epochs=1",
            f"--minibatch_size={args.minibatch_size}",
            f"--num_minibatches_per_task={args.minibatches_per_task}",
            "--num_workers=1",
            f"--num_ps_pods={num_ps}",
        ]
        + (["--use_async=true"] if mode == "async" else []),
    )
    t0, r0, t1, r1 = common.steady_state(job_dir, args.warmup_records, submitted + args.timeout)
    metrics = common.job_status(job_dir).get("evaluation_metrics") or {}
    return {
        "timed_records": r1 - r0,
        "seconds": t1 - t0,
        "samples_per_s": (r1 - r0) / (t1 - t0),
        "auc": float(metrics["auc"]) if "auc" in metrics else float("nan"),
        "wall_s": time.time() - submitted,
    }


# ------------------------------------------------------------------------------------------ driver
def plot(summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = [(ps, mode) for ps in summary["ps"] for mode in summary["modes"]]
    names = ["keras loop"] + [
        f"job, {ps} PS" + ("" if mode == "sync" else f"\n{mode}") for ps, mode in jobs
    ]
    rates = [summary["baseline_samples_per_s"]] + [
        summary[f"job_{job_key(*job)}_samples_per_s"] for job in jobs
    ]
    aucs = [summary["baseline_auc"]] + [summary[f"job_{job_key(*job)}_auc"] for job in jobs]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].bar(names, rates, color=["grey"] + ["tab:blue"] * len(jobs))
    axes[0].set_ylabel("training samples/s (steady state)")
    axes[1].bar(names, aucs, color=["grey"] + ["tab:blue"] * len(jobs))
    axes[1].axhline(summary["auc_ceiling"], color="tab:red", ls=":", label="hidden model (ceiling)")
    axes[1].set_ylim(0.5, 1.0)
    axes[1].set_ylabel("test AUC after one epoch")
    axes[1].legend(fontsize=8)
    fig.suptitle(
        f"DeepFM on synthetic_ctr: {summary['table_rows']:,} embedding rows, "
        f"{summary['rows']:,} rows, {summary['optimizer']}, 2-core machine"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cmd", nargs="?", choices=["_baseline"], help=argparse.SUPPRESS)
    p.add_argument("--data", default="", help="prepared synthetic_ctr directory (default: cache)")
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--features", type=int, default=26)
    p.add_argument("--vocab", type=int, default=38_462, help="ids per feature (26 x 38,462 ~ 10^6)")
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ps", default="1,2", help="PS counts of the jobs")
    p.add_argument(
        "--modes", default="sync", help="PS modes of the jobs, of sync,async (each PS count)"
    )
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam")
    p.add_argument(
        "--loop_feed",
        choices=["per_record", "batched"],
        default="per_record",
        help="the loop's feed: the model file's, record by record (what a user writes), or its "
        "maps over whole minibatches, as the job's worker runs them",
    )
    p.add_argument("--minibatch_size", type=int, default=256)
    p.add_argument("--minibatches_per_task", type=int, default=16)
    p.add_argument("--warmup_records", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=1, help="loop + jobs, alternating")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per job")
    p.add_argument("--plot", default="", help="write a PNG of the results here")
    args = p.parse_args(argv)
    if args.cmd == "_baseline":
        common.print_json(run_baseline(args))
        return 0
    try:
        ps_counts = [int(x) for x in args.ps.split(",")]
    except ValueError:
        p.error(f"--ps must be comma-separated integers, got {args.ps!r}")
    if any(n < 1 for n in ps_counts) or args.warmup_records >= args.rows * 0.9:
        p.error("--ps counts must be >= 1 and --warmup_records below the training rows")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes) or len(set(modes)) != len(modes):
        p.error(f"--modes must name some of {','.join(MODES)} once each, got {args.modes!r}")
    jobs = [(n, mode) for n in ps_counts for mode in modes]

    t = time.time()
    args.data = prepare_data(args)
    data_s = time.time() - t
    ceiling = _auc_ceiling(args.data)
    work = tempfile.mkdtemp(prefix="elasticdl-bench-sparse-")
    try:
        # Repeats alternate the loop and the jobs, so all see the same drift of the machine's
        # load; the summary holds medians, and the strict ratio against the loop's fastest run
        # (the Keras loop is bimodal on a loaded machine, and a slow run flatters).
        base_runs, job_runs = [], {job: [] for job in jobs}
        rows = []
        for r in range(args.repeats):
            base = baseline_in_child(args)
            base_runs.append(base)
            rows.append([r + 1, "keras loop, keras Embedding", base["timed_records"],
                         base["seconds"], base["samples_per_s"], 1.0, base["auc"], "-"])  # fmt: skip
            for n, mode in jobs:
                name = f"bench-sparse-{r}-{job_key(n, mode).replace('_', '-')}"
                job = run_job(args, os.path.join(work, "home"), name, n, mode)
                job_runs[(n, mode)].append(job)
                rows.append([r + 1, f"elasticdl job, 1 worker + {n} PS, {mode}",
                             job["timed_records"], job["seconds"], job["samples_per_s"],
                             job["samples_per_s"] / base["samples_per_s"], job["auc"],
                             job["wall_s"]])  # fmt: skip
        base_rate = common.median([b["samples_per_s"] for b in base_runs])
        base_fastest = max(b["samples_per_s"] for b in base_runs)
        base_auc = common.median([b["auc"] for b in base_runs])
        summary = {
            "benchmark": "sparse_job",
            "rows": args.rows,
            "features": args.features,
            "vocab": args.vocab,
            "table_rows": args.features * args.vocab,
            "zipf": args.zipf,
            "minibatch_size": args.minibatch_size,
            "optimizer": args.optimizer,
            "loop_feed": args.loop_feed,
            "ps": ps_counts,
            "modes": modes,
            "repeats": args.repeats,
            "auc_ceiling": ceiling,
            "baseline_samples_per_s": round(base_rate, 1),
            "baseline_fastest_samples_per_s": round(base_fastest, 1),
            "baseline_auc": round(base_auc, 4),
            "target_ratio": TARGET_RATIO,
            "cpus": os.cpu_count(),
            "data_prepare_s": round(data_s, 1),
        }
        for job in jobs:
            key = job_key(*job)
            runs = job_runs[job]
            rate = common.median([j["samples_per_s"] for j in runs])
            auc = common.median([j["auc"] for j in runs])
            summary[f"job_{key}_samples_per_s"] = round(rate, 1)
            summary[f"job_{key}_ratio"] = round(rate / base_rate, 3)
            # Each run over the loop run of its own repeat (the same minutes of the machine).
            paired = [j["samples_per_s"] / b["samples_per_s"] for j, b in zip(runs, base_runs)]
            summary[f"job_{key}_paired_ratio"] = round(common.median(paired), 3)
            summary[f"job_{key}_ratio_to_fastest_loop"] = round(rate / base_fastest, 3)
            summary[f"job_{key}_auc"] = round(auc, 4)
            summary[f"job_{key}_auc_gap"] = round(base_auc - auc, 4)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    common.print_table(
        f"Sparse job vs plain loop: DeepFM, {args.features} x {args.vocab:,} = "
        f"{args.features * args.vocab:,} embedding rows, {args.rows:,} rows (AUC ceiling "
        f"{ceiling:.4f}), {args.optimizer}, minibatch {args.minibatch_size}, steady state after "
        f"{args.warmup_records:,} records",
        [
            "run",
            "runner",
            "records timed",
            "seconds",
            "samples/s",
            "ratio",
            "test AUC",
            "job wall s",
        ],
        rows,
    )
    if args.plot:
        plot(summary, args.plot)
    common.print_json(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
