"""Session fixture ``engine``: a real Docker engine + registry for the image tests.

Started with scripts/container-engine/setup-dockerd.sh (installs Debian's docker.io and
docker-registry when missing). When that is impossible (not root, no apt, no network for the
packages) the tests are skipped with the reason -- unless ``ELASTICDL_REQUIRE_ENGINE`` is set
(CI), where that is an error.
"""

from __future__ import annotations

import os

import pytest
from elasticdl_tests.images.engine import EngineLease, EngineUnavailable


@pytest.fixture(scope="session")
def engine():
    pytest.importorskip("docker")
    lease = EngineLease()
    try:
        eng = lease.acquire()
    except EngineUnavailable as e:
        if os.environ.get("ELASTICDL_REQUIRE_ENGINE"):
            pytest.fail(
                f"no container engine: {e} (ELASTICDL_REQUIRE_ENGINE is set)", pytrace=False
            )
        pytest.skip(f"no container engine: {e}")
    try:
        yield eng
    finally:
        lease.release()


@pytest.fixture
def docker_env(engine, monkeypatch):
    """DOCKER_HOST of the test engine for code under test that reads the environment."""
    monkeypatch.setenv("DOCKER_HOST", engine.docker_host)
    for var in ("DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
        monkeypatch.delenv(var, raising=False)
    return engine
