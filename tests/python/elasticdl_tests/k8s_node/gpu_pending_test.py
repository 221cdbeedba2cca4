"""A GPU worker pod on the real node: what ``--worker_resource_request=...,gpu=1`` meets on a
cluster without GPUs. The node advertises no ``nvidia.com/gpu`` (there is no NVIDIA device
plugin here), so the real scheduler keeps the pod Pending as Unschedulable for that resource
instead of starting it without a GPU.
"""

from __future__ import annotations

import time
import uuid

from elasticdl.k8s.pods import PodTemplate, build_pod

BUSYBOX = "local/busybox:node"


def test_gpu_worker_stays_pending_without_a_device_plugin(node_k8s):
    name = f"elasticdl-gpu-worker-{uuid.uuid4().hex[:6]}"
    pod = build_pod(
        PodTemplate(namespace=node_k8s.namespace, image_pull_policy="Never"),
        name=name,
        job_name="gpu",
        replica_type="worker",
        replica_id=0,
        image=BUSYBOX,
        command=["sleep", "600"],
        resource_request="cpu=0.1,memory=32Mi,gpu=1",
    )
    assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    node_k8s.create_pod(pod)
    deadline = time.monotonic() + 60
    while True:
        status = node_k8s.get_pod(name).status
        scheduled = [c for c in status.conditions or [] if c.type == "PodScheduled"]
        if scheduled and scheduled[0].status == "False":
            break
        assert time.monotonic() < deadline, f"no scheduling decision in 60 s: {status}"
        time.sleep(0.2)
    (condition,) = scheduled
    assert condition.reason == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in condition.message, condition.message
    pod = node_k8s.get_pod(name)
    assert pod.status.phase == "Pending" and not pod.spec.node_name
    assert node_k8s.delete_pod(name)
