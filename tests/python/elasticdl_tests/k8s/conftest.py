"""Session fixtures: a real kube-apiserver (+ etcd + controller-manager) and a FAKE process
kubelet, shared by every Kubernetes test; one fresh namespace per test.

Without the binaries (``scripts/k8s/build-apiserver.sh`` builds them) the tests are skipped
with the reason — unless ``ELASTICDL_REQUIRE_K8S`` is set (CI), where that is an error.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from elasticdl_tests.k8s.cluster import LocalCluster, default_bin_dir, missing_binaries
from elasticdl_tests.k8s.process_kubelet import ProcessKubelet


@pytest.fixture(scope="session")
def k8s_cluster():
    missing = missing_binaries()
    if missing:
        message = (
            f"Kubernetes test binaries missing in {default_bin_dir()} ({', '.join(missing)}); "
            "build them with scripts/k8s/build-apiserver.sh"
        )
        if os.environ.get("ELASTICDL_REQUIRE_K8S"):
            pytest.fail(message + " (ELASTICDL_REQUIRE_K8S is set)", pytrace=False)
        pytest.skip(message)
    pytest.importorskip("kubernetes")
    state_dir = Path(tempfile.mkdtemp(prefix="elasticdl-k8s-"))
    cluster = LocalCluster(state_dir=state_dir).start()
    try:
        _create_priority_classes(cluster)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


def _create_priority_classes(cluster: LocalCluster) -> None:
    """ElasticDL's PriorityClasses, as `elasticdl rbac --priority_classes` prints them."""
    from elasticdl.k8s import priority_classes
    from elasticdl.k8s.client import to_model
    from kubernetes import client

    api = client.SchedulingV1Api(cluster.api_client())
    for manifest in priority_classes.manifests():
        api.create_priority_class(to_model(manifest, "V1PriorityClass"))


@pytest.fixture(scope="session")
def kubelet(k8s_cluster, tmp_path_factory):
    """The FAKE process kubelet (see ``process_kubelet``): pods run as local processes."""
    from kubernetes import client

    kubelet = ProcessKubelet(
        client.CoreV1Api(k8s_cluster.api_client()), tmp_path_factory.mktemp("kubelet")
    )
    kubelet.start()
    try:
        yield kubelet
    finally:
        kubelet.stop()


@pytest.fixture
def namespace(k8s_cluster):
    """A fresh namespace, deleted (with everything in it) after the test."""
    from kubernetes import client

    api = client.CoreV1Api(k8s_cluster.api_client())
    name = f"edl-{uuid.uuid4().hex[:8]}"
    api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        try:
            api.delete_namespace(name, _preload_content=False)
        except Exception:
            pass


@pytest.fixture
def served_namespace(namespace, kubelet):
    """A fresh namespace whose pods the process kubelet runs."""
    kubelet.serve(namespace)
    try:
        yield namespace
    finally:
        kubelet.forget(namespace)


@pytest.fixture
def k8s(k8s_cluster, namespace):
    """An admin :class:`elasticdl.k8s.client.K8sClient` for the test's namespace."""
    from elasticdl.k8s.client import K8sClient

    return K8sClient(namespace, api_client=k8s_cluster.api_client())
