"""colocation.py's reading of the job's progress, which fires the service's schedule: from the
status the master publishes on its pod, in the form ``KubernetesPlatform.publish_status``
writes (the real-node test runs the rest)."""

from __future__ import annotations

import json

import colocation  # pants: no-infer-dep (beside this file: the BUILD names it)
from elasticdl.common.job_status import JobStatus
from elasticdl.k8s.names import STATUS_ANNOTATION
from kubernetes.client import V1ObjectMeta, V1Pod, V1PodStatus


def _master(status: JobStatus | None) -> V1Pod:
    annotations = None
    if status is not None:
        text = json.dumps(status.published(), default=str, sort_keys=True)
        annotations = {STATUS_ANNOTATION: text}
    return V1Pod(
        metadata=V1ObjectMeta(name="elasticdl-j-master", annotations=annotations, labels={}),
        status=V1PodStatus(phase="Running"),
    )


def test_progress_counts_the_epochs_the_master_has_not_created_yet():
    # The master creates epochs as it goes: 100 records expected so far, of 4 epochs.
    status = JobStatus(
        phase="Running", records_trained=30, records_expected=100, epoch=1, num_epochs=4
    )
    assert colocation.progress(_master(status), "ns") == 30 / 400
    status.epoch, status.records_expected, status.records_trained = 4, 400, 400
    assert colocation.progress(_master(status), "ns") == 1.0


def test_no_progress_before_the_master_publishes_or_exists():
    assert colocation.progress(_master(None), "ns") == 0.0
    assert colocation.progress(_master(JobStatus(phase="Pending")), "ns") == 0.0
    assert colocation.progress(None, "ns") == 0.0
