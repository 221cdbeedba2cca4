"""How many CPUs this process may use, and how a training worker splits them.

`available_cpus()` is the smaller of the CPUs the process may run on (its affinity mask) and
its cgroup CPU quota, rounded up: a Kubernetes pod limited to 2 CPUs on a 64-core node has an
affinity of 64 CPUs but can only use 2, and sizing thread pools for 64 there makes them fight
over the quota (and get throttled) instead of working. Workers started as local processes
share one host: the master gives each its share in `ELASTICDL_WORKER_CPUS` (the host's CPUs
divided by the number of workers), which caps the figure the same way.

`split_for_training(cpus)`: a training worker runs two kinds of work at once. Its look-ahead
computes the next task's minibatches (reading and parsing records in a tf.data pipeline) while
the compiled step trains on the current ones. Given every CPU each, on a small host they
preempt each other: a step's parallel op waits for its slowest shard, so a core taken by
the parser for one time slice stalls the whole op while the other core idles. Giving each its
own share removes that: half the CPUs (at least one) for the data pipeline, the rest for the
step's intra-op pool (measurements: benchmarks/runtime/README.md). A user's own
`TF_NUM_INTRAOP_THREADS` is kept.
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Optional

logger = logging.getLogger(__name__)

CGROUP_ROOT = "/sys/fs/cgroup"
INTRA_OP_ENV = "TF_NUM_INTRAOP_THREADS"
WORKER_CPUS_ENV = "ELASTICDL_WORKER_CPUS"


def _affinity_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cgroup_cpu_limit(root: str = CGROUP_ROOT) -> Optional[float]:
    """The CPU quota of this process's cgroup in CPUs, or None when there is none.

    cgroup v2: `cpu.max` holds "<quota> <period>" or "max <period>"; v1: `cpu/cpu.cfs_quota_us`
    (-1 for none) and `cpu/cpu.cfs_period_us`. Inside a container the process's own cgroup is
    mounted at the root, which is where both are read."""
    v2 = _read(os.path.join(root, "cpu.max"))
    if v2 is not None:
        parts = v2.split()
        quota, period = parts if len(parts) == 2 else ("max", "")
    else:
        quota = _read(os.path.join(root, "cpu", "cpu.cfs_quota_us"))
        period = _read(os.path.join(root, "cpu", "cpu.cfs_period_us"))
    try:
        q, p = int(quota), int(period)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # "max", missing or garbled: no quota
        return None
    return q / p if q > 0 and p > 0 else None


def available_cpus(root: Optional[str] = None, environ=None) -> int:
    """CPUs this process can actually use: its affinity, capped by its cgroup quota and by
    `ELASTICDL_WORKER_CPUS` when that is a positive integer."""
    environ = os.environ if environ is None else environ
    cpus = _affinity_cpus()
    limit = cgroup_cpu_limit(CGROUP_ROOT if root is None else root)
    if limit is not None:
        cpus = min(cpus, max(1, math.ceil(limit)))
    share = environ.get(WORKER_CPUS_ENV, "").strip()
    if share.isdigit() and int(share) > 0:
        cpus = min(cpus, int(share))
    return max(1, cpus)


def share_per_worker(num_workers: int, cpus: Optional[int] = None) -> int:
    """Each of `num_workers` workers on one host: its whole share of the host's CPUs."""
    cpus = available_cpus() if cpus is None else cpus
    return max(1, cpus // max(1, int(num_workers)))


@dataclass(frozen=True)
class TrainingThreads:
    data: int  # the training tf.data pipeline's private thread pool
    step: int  # TensorFlow's intra-op pool (the compiled step's parallel ops)


def split_for_training(cpus: int) -> TrainingThreads:
    cpus = max(1, int(cpus))
    data = max(1, cpus // 2)
    return TrainingThreads(data=data, step=max(1, cpus - data))


def apply_training_split(environ=None, cpus: Optional[int] = None) -> TrainingThreads:
    """Size TensorFlow's intra-op pool for a training worker; call before TensorFlow runs any
    op (it reads `TF_NUM_INTRAOP_THREADS` once, when its runtime starts). Returns the split,
    with `step` as TensorFlow will use it (the user's value when one was set)."""
    environ = os.environ if environ is None else environ
    split = split_for_training(available_cpus(environ=environ) if cpus is None else cpus)
    user = environ.get(INTRA_OP_ENV, "").strip()
    if user:
        try:
            return TrainingThreads(data=split.data, step=int(user))
        except ValueError:
            return split  # not a number: what TensorFlow makes of it is its business
    environ[INTRA_OP_ENV] = str(split.step)
    logger.info(
        "CPU split: %d thread(s) for the data pipeline, %d for the training step",
        split.data,
        split.step,
    )
    return split
