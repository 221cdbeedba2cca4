"""Two ways to put jobs on the cluster, for the competing-jobs experiment.

* :class:`GangAdmission`, the baseline: a job is created only when ALL of its pods fit at
  once in the cluster's free CPU, the way a gang scheduler admits a job. Free CPU is the
  nodes' allocatable CPU minus what is held: every admitted job holds its whole request
  (master + PS + workers) from its admission until its last pod has ended or gone (as a gang
  scheduler reserves the gang, so a job whose master has not created its workers yet still
  counts in full), plus the requests of every other pod placed on a node. Jobs are admitted
  in the order they were submitted (first come, first served: a later job never overtakes a
  waiting one).
* :class:`Elastic`, ElasticDL as it is: a job is created when it is submitted; its pods that
  do not fit wait Pending and the scheduler places them when CPU frees up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import cluster  # noqa: F401  (puts src/python on the path)
from elasticdl.k8s.names import LABEL_JOB
from utilisation import allocatable_cpu, pod_cpu_request

_ENDED = ("Succeeded", "Failed")


@dataclass
class QueuedJob:
    name: str
    cpu: float  # the sum of its pods' CPU requests
    submit_at: float  # seconds after the start, when the user submits it
    create: Callable[[], None]
    created_at: float | None = None


def _live_requests(core, namespace: str) -> dict[str, float]:
    """CPU requests of pods placed on a node and not ended, by the job they belong to ("" for
    pods of no ElasticDL job or outside ``namespace``)."""
    held: dict[str, float] = {}
    for pod in core.list_pod_for_all_namespaces().items:
        if not pod.spec.node_name or pod.status.phase in _ENDED:
            continue
        labels = pod.metadata.labels or {}
        job = labels.get(LABEL_JOB, "") if pod.metadata.namespace == namespace else ""
        held[job] = held.get(job, 0.0) + pod_cpu_request(pod)
    return held


@dataclass
class GangAdmission:
    core: object
    namespace: str
    allocatable: float = 0.0
    _admitted: list[QueuedJob] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.allocatable = allocatable_cpu(self.core)

    def free_cpu(self, finished: set[str]) -> float:
        held = _live_requests(self.core, self.namespace)
        reserved = sum(
            held.get(j.name, 0.0) if j.name in finished else j.cpu for j in self._admitted
        )
        admitted = {j.name for j in self._admitted}
        others = sum(cpu for job, cpu in held.items() if job not in admitted)
        return self.allocatable - reserved - others

    def step(self, queue: list[QueuedJob], now: float, finished: set[str]) -> None:
        """Create the submitted jobs at the head of the queue that fit now."""
        for job in queue:
            if job.created_at is not None:
                continue
            if job.submit_at > now or job.cpu > self.free_cpu(finished) + 1e-9:
                return  # first come, first served
            job.create()
            job.created_at = now
            self._admitted.append(job)


@dataclass
class Elastic:
    def step(self, queue: list[QueuedJob], now: float, finished: set[str]) -> None:
        for job in queue:
            if job.created_at is None and job.submit_at <= now:
                job.create()
                job.created_at = now
