"""A service account's token as the API server's token controller mints it, for the tests
that act as that account (the RBAC manifest's master, the deployed job server)."""

from __future__ import annotations

import base64
import time

import pytest


def service_account_token(api_client, namespace: str, account: str, timeout: float = 60) -> str:
    """The bearer token of ``account`` in ``namespace``, read with ``api_client`` once the
    controller has minted its Secret; the test fails after ``timeout`` seconds without one."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for secret in core.list_namespaced_secret(namespace).items:
            annotations = secret.metadata.annotations or {}
            if (
                secret.type == "kubernetes.io/service-account-token"
                and annotations.get("kubernetes.io/service-account.name") == account
                and secret.data
            ):
                return base64.b64decode(secret.data["token"]).decode()
        time.sleep(0.3)
    pytest.fail(f"no token minted for service account {account} in {timeout}s")
