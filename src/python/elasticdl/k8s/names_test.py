"""The names and labels of a job's Kubernetes objects, and the package's import cost."""

import os
import subprocess
import sys

from elasticdl.k8s import names


def test_object_names():
    assert names.master_pod_name("mnist") == "elasticdl-mnist-master"
    assert names.pod_name("mnist", "ps", 1) == "elasticdl-mnist-ps-1"
    assert names.pod_name("mnist", "worker", 12) == "elasticdl-mnist-worker-12"
    assert names.service_host("mnist", "ps", 0, "team") == "elasticdl-mnist-ps-0.team.svc"
    assert [names.volume_name(i) for i in range(2)] == ["volume-0", "volume-1"]
    assert names.SERVICE_ACCOUNT == "elasticdl"
    assert names.STATUS_ANNOTATION == "elasticdl-status"


def test_labels_and_selectors():
    assert names.job_labels("mnist", "worker", 3) == {
        "app": "elasticdl",
        "elasticdl-job-name": "mnist",
        "elasticdl-replica-type": "worker",
        "elasticdl-replica-index": "3",
    }
    assert names.job_labels("mnist", "master") == {
        "app": "elasticdl",
        "elasticdl-job-name": "mnist",
        "elasticdl-replica-type": "master",
    }
    assert names.job_selector("mnist") == "elasticdl-job-name=mnist"
    assert names.job_selector("mnist", "ps") == "elasticdl-job-name=mnist,elasticdl-replica-type=ps"
    assert names.replicas_selector("mnist") == (
        "elasticdl-job-name=mnist,elasticdl-replica-type in (ps,worker)"
    )
    assert names.masters_selector() == "elasticdl-replica-type=master"
    assert set(names.PROTECTED_LABELS) <= set(names.job_labels("j", "ps", 0))


def test_importing_the_package_leaves_the_sdk_alone():
    """The light client imports these modules; the kubernetes SDK loads only when a client or
    a pod object is built."""
    code = (
        "import sys\n"
        "import elasticdl.k8s.names, elasticdl.k8s.termination, elasticdl.k8s.resources\n"
        "import elasticdl.k8s.volumes, elasticdl.k8s.client, elasticdl.k8s.cluster_spec\n"
        "import elasticdl.k8s.pods\n"
        "from elasticdl.k8s.termination import read_termination\n"
        "read_termination({'status': {'phase': 'Failed'}})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'yaml')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
