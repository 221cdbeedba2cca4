"""Session fixture ``k8s_node``: ONE real multi-node Kubernetes cluster (real kubelets, real
containers, a pod network, kube-proxy, cluster DNS; ``scripts/k8s/start-node.sh``) shared by
every real-cluster test -- across test files too (see ``node.NodeLease``). One fresh namespace
per test. ``exclusive_cluster`` (module scope) is the cluster for a module alone: for tests
that take nodes or the whole cluster down.

Where the machine cannot run it (not root, no cgroup v1, the binaries missing) the tests are
skipped with the reason in one line -- unless ``ELASTICDL_REQUIRE_K8S_NODE`` is set (CI, after
``scripts/k8s/build-node.sh``), where that, and missing wheels for the image tests, is an
error.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest
from elasticdl_tests.k8s_node.node import (
    REQUIRE_ENV,
    NodeLease,
    NodeUnavailable,
    bin_dir,
    missing_binaries,
    repo_root,
    why_not_here,
)


def _unavailable(message: str):
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{message} ({REQUIRE_ENV} is set)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def k8s_node_lease():
    pytest.importorskip("kubernetes")
    reason = why_not_here()
    if reason:
        _unavailable(reason)
    missing = missing_binaries()
    if missing and not os.environ.get(REQUIRE_ENV):
        # start-node.sh would build them (~10 min): only where asked to (CI).
        _unavailable(
            f"real-node binaries missing in {bin_dir()} ({', '.join(missing)}); "
            "build them with scripts/k8s/build-node.sh"
        )
    lease = NodeLease()
    try:
        lease.acquire()
    except NodeUnavailable as e:
        _unavailable(f"no real Kubernetes cluster: {e}")
    try:
        yield lease
    finally:
        lease.release()


@pytest.fixture(scope="session")
def k8s_node(k8s_node_lease):
    """The shared cluster (:class:`node.Node`)."""
    return k8s_node_lease.node


@pytest.fixture(scope="module")
def exclusive_cluster(k8s_node_lease):
    """The cluster for this module alone (no other test process uses it meanwhile); it is
    started again whole afterwards if a test left it (or a node of it) down."""
    with k8s_node_lease.exclusive() as node:
        yield node


@pytest.fixture(scope="session")
def base_image(k8s_node):
    """The real CPU base image in the node's engine, built once for all real-node test files
    (see base_image.py): (name, seconds this process spent building it; 0 when reused)."""
    from elasticdl_tests.k8s_node import base_image as images

    root = repo_root()
    dist = images.wheel_dir(root)
    if dist is None:
        _unavailable(
            "the image installs the Pants wheels: set ELASTICDL_WHEEL_DIR or run ./pants package "
            "//:elasticdl-wheel src/python:elasticdl-client-wheel src/cc:native"
        )
    return images.ensure_base_image(k8s_node, root, dist)


@pytest.fixture
def node_namespace(k8s_node):
    """A fresh namespace on the real cluster, deleted (with its pods) after the test."""
    from kubernetes import client

    api = client.CoreV1Api(k8s_node.api_client())
    name = f"edl-{uuid.uuid4().hex[:8]}"
    api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        # ServiceAccount admission refuses pods until the token controller gave the namespace's
        # default account its token (~1 s).
        deadline = time.monotonic() + 60
        while True:
            sa = api.list_namespaced_service_account(name, field_selector="metadata.name=default")
            if sa.items and sa.items[0].secrets:
                break
            assert time.monotonic() < deadline, f"no token for the default account of {name}"
            time.sleep(0.1)
        yield name
    finally:
        try:
            api.delete_namespace(name, grace_period_seconds=0, _preload_content=False)
        except Exception:
            pass


@pytest.fixture
def node_k8s(k8s_node, node_namespace):
    """An admin :class:`elasticdl.k8s.client.K8sClient` for the test's namespace."""
    from elasticdl.k8s.client import K8sClient

    return K8sClient(node_namespace, api_client=k8s_node.api_client())
