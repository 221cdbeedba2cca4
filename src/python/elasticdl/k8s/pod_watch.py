"""A watch of pods that survives what ends a plain one: an API server that compacted the
resource version (HTTP 410) or a connection that breaks. It re-lists and tells the consumer
what it missed, so a consumer (the master's platform) never misses a pod's final state."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Iterator

from elasticdl.k8s.api_errors import api_error, api_exception_class

if TYPE_CHECKING:
    from elasticdl.k8s.client import K8sClient

logger = logging.getLogger(__name__)


def watch_pods(
    k8s: "K8sClient", label_selector: str, stop: threading.Event, timeout_seconds: int = 30
) -> Iterator[tuple[str, Any]]:
    """Yield ``(event_type, pod)`` for pods matching ``label_selector`` until ``stop`` is set.

    Starts with an ``ADDED`` event per existing pod, then streams ADDED/MODIFIED/DELETED.
    When the server has compacted the resource version (HTTP 410) or the connection
    breaks, it re-lists and yields ``MODIFIED`` for every pod still there and ``DELETED``
    for pods that disappeared meanwhile, so a consumer never misses a final state.
    ``stop`` is checked at least every ``timeout_seconds``.
    """
    from kubernetes import watch

    known: dict[str, Any] = {}
    resource_version = None
    first = True
    while not stop.is_set():
        if resource_version is None:
            try:
                listing = k8s.core.list_namespaced_pod(k8s.namespace, label_selector=label_selector)
            except Exception as e:  # API server briefly unreachable: retry
                logger.warning("listing pods (%s) failed: %s; retrying", label_selector, e)
                stop.wait(1.0)
                continue
            current = {p.metadata.name: p for p in listing.items}
            for name, pod in list(known.items()):
                if name not in current:
                    del known[name]
                    yield "DELETED", pod
            for name, pod in current.items():
                known[name] = pod
                yield ("ADDED" if first else "MODIFIED"), pod
            first = False
            resource_version = listing.metadata.resource_version
        w = watch.Watch()
        try:
            for event in w.stream(
                k8s.core.list_namespaced_pod,
                k8s.namespace,
                label_selector=label_selector,
                resource_version=resource_version,
                timeout_seconds=int(timeout_seconds),
                allow_watch_bookmarks=False,
            ):
                if stop.is_set():
                    w.stop()
                    break
                kind, pod = event["type"], event["object"]
                if kind == "ERROR" or not hasattr(pod, "metadata"):
                    # A watch-level Status (e.g. 410 Gone delivered in-stream): relist.
                    resource_version = None
                    break
                resource_version = pod.metadata.resource_version
                if kind == "DELETED":
                    known.pop(pod.metadata.name, None)
                else:
                    known[pod.metadata.name] = pod
                yield kind, pod
        except api_exception_class() as e:
            if e.status != 410:
                logger.warning(
                    "pod watch (%s) failed: %s; re-listing", label_selector, api_error(e, "watch")
                )
                stop.wait(0.5)
            resource_version = None
        except Exception as e:  # connection reset, read timeout, ...
            if stop.is_set():
                break
            logger.warning("pod watch (%s) interrupted: %s; re-listing", label_selector, e)
            stop.wait(0.5)
            resource_version = None
        finally:
            w.stop()
