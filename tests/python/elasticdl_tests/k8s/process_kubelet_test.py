"""The FAKE process kubelet acts on one pod, not on whichever pod has its name: a pod deleted at
once (grace 0) may have a successor of the same name within milliseconds (a relaunched PS, a
PS set swapped), and what the kubelet still does for the old one — report its exit, bind it —
must not reach the successor. A real kubelet works by uid; with the fake one acting by name, a
PS-set swap had its new PS 0 marked Failed with the old one's exit code, relaunched (which
deletes it), marked Failed again: five relaunches in a row (the k8s tier, under load)."""

from __future__ import annotations

import copy
import subprocess
import sys
import time

import pytest
from elasticdl.k8s.pods import PodTemplate, build_pod
from elasticdl_tests.k8s.process_kubelet import NODE_NAME, _Running


def _create(k8s, name: str):
    pod = build_pod(
        PodTemplate(namespace=k8s.namespace),
        name=name,
        job_name="kubelet",
        replica_type="ps",
        replica_id=0,
        image="local/elasticdl:test",
        command=["python", "-m", "elasticdl_tests.k8s.sleeper", "--seconds", "3600"],
    )
    return k8s.create_pod(pod)


def _phase_within(k8s, name: str, phase: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = k8s.get_pod(name)
        if pod is not None and pod.status.phase == phase:
            return
        time.sleep(0.1)
    pytest.fail(f"pod {name} not {phase} within {timeout}s: {k8s.get_pod(name)}")


def test_an_old_pods_exit_is_not_reported_on_its_successor(k8s, served_namespace, kubelet):
    successor = _create(k8s, "same-name")
    _phase_within(k8s, "same-name", "Running")
    ended = subprocess.Popen([sys.executable, "-c", "raise SystemExit(137)"])
    ended.wait()
    old = _Running(served_namespace, "same-name", "uid-of-the-old-pod", "main", "img", ended)
    kubelet._report_exit(old)
    pod = k8s.get_pod("same-name")
    assert pod.metadata.uid == successor.metadata.uid
    assert pod.status.phase == "Running", pod.status


def test_an_old_pod_is_not_started_in_place_of_its_successor(k8s, served_namespace, kubelet):
    kubelet.hold(served_namespace, "held")  # the successor stays unscheduled
    successor = _create(k8s, "held")
    old = copy.deepcopy(successor)
    old.metadata.uid = "uid-of-the-old-pod"
    kubelet._start_pod(old)  # its ADDED event, read after it was replaced
    pod = k8s.get_pod("held")
    assert pod.spec.node_name is None and pod.status.phase == "Pending", pod
    assert "uid-of-the-old-pod" not in kubelet._running
    kubelet.release(served_namespace, "held")
    _phase_within(k8s, "held", "Running")
    assert k8s.get_pod("held").spec.node_name == NODE_NAME
