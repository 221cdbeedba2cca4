"""Where pod logs are read.

The Kubernetes API serves a pod's log (the API server fetches it from the pod's kubelet):
:class:`ApiPodLogs`, what ElasticDL uses. Everything that reads pod logs (``elasticdl logs``
of a job on Kubernetes, the job server's image-build logs) takes a :class:`PodLogs`, so a
cluster whose kubelet cannot serve logs can be given another reader; the apiserver-tier tests
give one that reads their stand-in kubelet's files.
"""

from __future__ import annotations

import abc
import time
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from elasticdl.k8s.termination import FAILED, RUNNING, SUCCEEDED, read_termination

if TYPE_CHECKING:
    from elasticdl.k8s.client import K8sClient

POLL_SECONDS = 0.3
_STARTED = (RUNNING, SUCCEEDED, FAILED)


def _always() -> bool:
    return True


class PodLogs(abc.ABC):
    """The logs of the pods of one namespace (``k8s``: its client)."""

    @abc.abstractmethod
    def read(self, k8s: "K8sClient", pod: str, containers: Sequence[str] = ()) -> str | None:
        """The pod's log as it is now: its ``containers``' logs one after the other, a
        container that has not started adding nothing (none named: the pod's only container;
        its log must be readable, else ``K8sApiError``). None: there is no such pod."""

    @abc.abstractmethod
    def follow(
        self,
        k8s: "K8sClient",
        pod: str,
        containers: Sequence[str] = (),
        active: Callable[[], bool] = _always,
    ) -> Iterator[str]:
        """The pod's log as it is written, from its start until the pod has ended or is gone
        (or ``active()`` turns false while the pod has not started)."""


def pod_ended(pod) -> bool:
    """Whether a pod (None: gone) will write no more."""
    return pod is None or read_termination(pod).is_terminal


class ApiPodLogs(PodLogs):
    """The Kubernetes API's pod log."""

    def read(self, k8s: "K8sClient", pod: str, containers: Sequence[str] = ()) -> str | None:
        if not containers:
            return k8s.read_pod_log(pod)
        parts = []
        for container in containers:
            try:
                text = k8s.read_pod_log(pod, container=container)
            except Exception:  # a container that has not started has no log yet
                text = None
            if text:
                parts.append(text)
        return "".join(parts)

    def follow(
        self,
        k8s: "K8sClient",
        pod: str,
        containers: Sequence[str] = (),
        active: Callable[[], bool] = _always,
    ) -> Iterator[str]:
        for container in containers or (None,):
            if not _wait_started(k8s, pod, container, active):
                return
            # The API server ends the stream when the container ends.
            yield from k8s.follow_pod_log(pod, container=container)


def _started(pod, container: str | None) -> bool:
    if container is None:
        return read_termination(pod).phase in _STARTED
    status = pod.status
    statuses = (status.init_container_statuses or []) + (status.container_statuses or [])
    return any(
        s.name == container and s.state and (s.state.running or s.state.terminated)
        for s in statuses
    )


def _wait_started(k8s: "K8sClient", pod: str, container: str | None, active) -> bool:
    """Wait until ``container`` of the pod has started (True; a log exists from then on), or
    until it never will: the pod ended or went, or ``active()`` turned false (False)."""
    while active():
        try:
            current = k8s.get_pod(pod)
        except Exception:  # the API server away for a moment: as if not seen yet
            time.sleep(POLL_SECONDS)
            continue
        if current is None:
            return False
        if current.status is not None:
            if _started(current, container):
                return True
            if current.status.phase in (SUCCEEDED, FAILED):
                return False
        time.sleep(POLL_SECONDS)
    return False
