"""The cluster's CPU, as the scheduler books it and as the pods burn it, sampled over time.

* **free / requested**: the nodes' allocatable CPU, and the CPU requests of the pods placed on
  a node that have not ended (Pending-but-bound, Running, Terminating all hold their share:
  the scheduler frees it only when the pod is gone or has ended);
* **used**: the CPU time the nodes' pods consumed, from each kubelet's ``kubepods`` cgroup
  (cgroup v1 ``cpuacct.usage``, nanoseconds; ``start-node.sh`` gives kubelet ``i`` the cgroup
  root ``$ELASTICDL_NODE_CGROUP/n<i>``), differenced between samples.

:class:`Sampler` records both every ``interval`` seconds in a thread; :func:`plot` draws the
timeline as a PNG.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

_CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_ENDED = ("Succeeded", "Failed")


def cpu(quantity: str) -> float:
    """A Kubernetes CPU quantity ("250m", "0.25", "1") in cores."""
    quantity = str(quantity)
    if quantity.endswith("m"):
        return float(quantity[:-1]) / 1000
    return float(quantity)


def pod_cpu_request(pod) -> float:
    total = 0.0
    for container in pod.spec.containers:
        requests = (container.resources and container.resources.requests) or {}
        total += cpu(requests.get("cpu", "0"))
    return total


def allocatable_cpu(core) -> float:
    return sum(cpu(n.status.allocatable["cpu"]) for n in core.list_node().items)


def requested_cpu(core) -> float:
    """CPU requested by every pod placed on a node that has not ended, in all namespaces."""
    return sum(
        pod_cpu_request(p)
        for p in core.list_pod_for_all_namespaces().items
        if p.spec.node_name and p.status.phase not in _ENDED
    )


def kubepods_cgroups(nodes: int) -> list[Path]:
    """Each kubelet's kubepods cgroup in the cpuacct hierarchy."""
    root = os.environ.get("ELASTICDL_NODE_CGROUP", "/elasticdl-node").strip("/")
    return [_CPUACCT / root / f"n{i}" / "kubepods" for i in range(1, nodes + 1)]


def _usage_ns(cgroups: list[Path]) -> int:
    total = 0
    for cgroup in cgroups:
        try:
            total += int((cgroup / "cpuacct.usage").read_text())
        except (OSError, ValueError):
            pass  # a node without pods yet has no kubepods cgroup
    return total


@dataclass
class Sample:
    t: float  # seconds since the sampler started
    requested: float  # fraction of allocatable CPU
    used: float  # fraction of allocatable CPU over the last interval


@dataclass
class Sampler:
    core: object
    interval: float = 1.0
    samples: list[Sample] = field(default_factory=list)

    def __post_init__(self) -> None:
        nodes = self.core.list_node().items
        self.allocatable = sum(cpu(n.status.allocatable["cpu"]) for n in nodes)
        self._cgroups = kubepods_cgroups(len(nodes))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()

    def start(self) -> "Sampler":
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        last_t, last_ns = time.monotonic(), _usage_ns(self._cgroups)
        while not self._stop.wait(self.interval):
            try:
                requested = requested_cpu(self.core)
            except Exception:  # an API hiccup: skip this sample, not the run
                continue
            now, ns = time.monotonic(), _usage_ns(self._cgroups)
            used = (ns - last_ns) / 1e9 / max(now - last_t, 1e-6)
            last_t, last_ns = now, ns
            self.samples.append(
                Sample(now - self.t0, requested / self.allocatable, used / self.allocatable)
            )

    def mean(self, start: float, end: float) -> tuple[float, float]:
        """Mean (requested, used) fractions over samples in [start, end] (sampler seconds)."""
        window = [s for s in self.samples if start <= s.t <= end]
        if not window:
            return 0.0, 0.0
        return (
            sum(s.requested for s in window) / len(window),
            sum(s.used for s in window) / len(window),
        )


def plot(sampler: Sampler, path: Path, title: str, marks: dict[str, float]) -> None:
    """The requested and used timeline, with vertical lines at ``marks`` (label -> seconds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t for s in sampler.samples]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(t, [100 * s.requested for s in sampler.samples], label="requested", lw=1.5)
    ax.plot(t, [100 * s.used for s in sampler.samples], label="used (cgroups)", lw=1, alpha=0.8)
    for label, x in marks.items():
        ax.axvline(x, color="grey", ls=":", lw=0.8)
        ax.text(x, 103, label, rotation=90, fontsize=7, va="bottom", ha="center")
    ax.set_ylim(0, 125)
    ax.set_xlabel("seconds")
    ax.set_ylabel(f"% of {sampler.allocatable:g} allocatable CPUs")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
