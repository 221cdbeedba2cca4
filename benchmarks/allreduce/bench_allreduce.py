"""AllReduce training throughput with 1, 2 and 4 workers (local platform, real processes).

Runs the MNIST CNN of the model zoo on a Fashion-MNIST subset as an AllreduceStrategy job per
worker count and reports training samples/s, measured from the first rendezvous generation (all
start-up excluded) to the end of training, and the ratio to 1 worker. The last stdout line is
JSON.

    PYTHONPATH=src/python:model_zoo python benchmarks/allreduce/bench_allreduce.py [--workers 1,2,4]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path

MODEL_ZOO = str(Path(__file__).resolve().parents[2] / "model_zoo")


def run_job(data_dir: str, workers: int, epochs: int, minibatch: int, job_dir: str) -> dict:
    from elasticdl.common.job_spec import JobSpec
    from elasticdl.master.job import Job

    spec, _ = JobSpec(
        job_name=f"bench-allreduce-{workers}",
        model_zoo=MODEL_ZOO,
        model_def="mnist.mnist_functional_api.custom_model",
        training_data=f"{data_dir}/train",
        minibatch_size=minibatch,
        num_minibatches_per_task=4,
        num_epochs=epochs,
        num_workers=workers,
        distribution_strategy="AllreduceStrategy",
        platform="local",
        job_dir=job_dir,
        log_level="WARNING",
    ).resolve()
    job = Job(spec)
    marks: dict = {}

    def watch():
        while "end" not in marks:
            h = job.rendezvous.history
            if "start" not in marks and h and len(h[-1][1]) == workers:
                marks["start"] = (time.monotonic(), job.tm.summary().records_trained)
            if "start" in marks and job.tm.training_finished:
                marks["end"] = (time.monotonic(), job.tm.summary().records_trained)
            time.sleep(0.02)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    code = job.run()
    marks.setdefault("end", (time.monotonic(), job.tm.summary().records_trained))
    t.join(timeout=2)
    if code != 0 or "start" not in marks:
        raise RuntimeError(f"{workers}-worker job failed (exit {code}); see {job_dir}/logs")
    (t0, r0), (t1, r1) = marks["start"], marks["end"]
    return {
        "workers": workers,
        "records": r1 - r0,
        "seconds": round(t1 - t0, 2),
        "samples_per_s": round((r1 - r0) / (t1 - t0), 1),
        "generations": len(job.rendezvous.history),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--records", type=int, default=4096, help="Fashion-MNIST training records")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--minibatch_size", type=int, default=64)
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from elasticdl.data.datasets import prepare

    tmp = tempfile.mkdtemp(prefix="bench-allreduce-")
    data = prepare(
        "fashion_mnist",
        os.path.join(tmp, "data"),
        progress=False,
        limit=a.records,
        records_per_shard=1024,
    )
    results = []
    for n in [int(x) for x in a.workers.split(",")]:
        r = run_job(data.output_dir, n, a.epochs, a.minibatch_size, os.path.join(tmp, f"job{n}"))
        print(
            f"{n} worker(s): {r['samples_per_s']} samples/s ({r['records']} records in {r['seconds']} s)",
            flush=True,
        )
        results.append(r)
    base = results[0]["samples_per_s"]
    for r in results:
        r["ratio_to_first"] = round(r["samples_per_s"] / base, 2)
    print(
        json.dumps(
            {
                "benchmark": "allreduce_mnist_cnn",
                "cpu_count": os.cpu_count(),
                "minibatch_size": a.minibatch_size,
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
