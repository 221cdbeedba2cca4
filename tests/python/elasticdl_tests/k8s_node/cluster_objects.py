"""Small helpers of the real-cluster tests: objects from YAML through ``kubectl apply``, pods'
phases and placements read back, a shell command run in a pod."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from elasticdl_tests.waiting import wait_for

BUSYBOX = "local/busybox:node"  # a static busybox in every node's engine (start-node.sh)
# A pod that exits at once on SIGTERM (PID 1 ignores signals it has no handler for).
SLEEPER = ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 100000 & wait"]


_manifests = itertools.count()


def apply(cluster, namespace: str, manifest: str, scratch: Path) -> None:
    path = scratch / f"manifest-{next(_manifests)}.yaml"
    path.write_text(manifest)
    cluster.kubectl("apply", "-n", namespace, "-f", str(path))


def pods(cluster, namespace: str, selector: str = "") -> list[dict]:
    args = ["get", "pods", "-n", namespace, "-o", "json"]
    if selector:
        args += ["-l", selector]
    return json.loads(cluster.kubectl(*args))["items"]


def pod(cluster, namespace: str, name: str) -> dict | None:
    out = cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(out) if out.strip() else None


def running(cluster, namespace: str, name: str, timeout: float = 120) -> dict:
    """The pod once Running (the test fails with its events otherwise)."""

    def up():
        p = pod(cluster, namespace, name)
        return p if p and p["status"].get("phase") == "Running" else None

    return wait_for(up, timeout, f"pod {name} to run", lambda: describe(cluster, namespace))


def ended(cluster, namespace: str, name: str, timeout: float = 120) -> dict:
    def done():
        p = pod(cluster, namespace, name)
        return p if p and p["status"].get("phase") in ("Succeeded", "Failed") else None

    return wait_for(done, timeout, f"pod {name} to end", lambda: describe(cluster, namespace))


def describe(cluster, namespace: str) -> str:
    return cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False) + (
        cluster.kubectl("get", "events", "-n", namespace, check=False)[-3000:]
    )


def sh(cluster, namespace: str, name: str, script: str, timeout: float = 60) -> str:
    """``sh -c SCRIPT`` in the pod's container (kubectl exec: through the apiserver and the
    pod's kubelet); its stdout."""
    return cluster.kubectl("exec", "-n", namespace, name, "--", "sh", "-c", script, timeout=timeout)
