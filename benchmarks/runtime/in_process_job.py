"""The README's Fashion-MNIST training job, run by a master inside the benchmark's own process
(local worker and PS processes), for benchmarks that act on the live job object."""
from __future__ import annotations

import os
import tempfile
import threading

import common  # noqa: F401  (puts the sources on sys.path)


def start_fashion_mnist_job(name: str, data_dir: str, files: int, num_ps: int, on_done):
    """Starts the job on a daemon thread with `files` training files and `num_ps` PS; it trains
    (1000 epochs) until the caller stops it. `on_done(worker_id)` runs at each task a worker
    reports done, at that moment. Returns (job, spec, the thread running job.run)."""
    from elasticdl.common.job_spec import JobSpec
    from elasticdl.master.job import Job

    data = common.prepare_fashion_mnist(data_dir)
    work = tempfile.mkdtemp(prefix=f"elasticdl-{name}-")
    train = common.subset_dir(os.path.join(data, "train"), files, os.path.join(work, "train"))
    spec, _ = JobSpec(
        job_name=f"bench-{name}",
        model_zoo=common.MODEL_ZOO,
        model_def="mnist.mnist_functional_api.custom_model",
        training_data=train,
        minibatch_size=64,
        num_minibatches_per_task=2,
        num_epochs=1000,  # stopped by the benchmark once it has its measurements
        num_workers=2,
        num_ps_pods=num_ps,
        platform="local",
        job_dir=os.path.join(work, "job"),
        log_level="WARNING",
    ).resolve()
    job = Job(spec)
    job.tm.add_done_listener(lambda task, ok, worker_id: ok and on_done(worker_id))
    runner = threading.Thread(target=job.run, name="job", daemon=True)
    runner.start()
    return job, spec, runner
