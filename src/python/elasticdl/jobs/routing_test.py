"""backend_for: the one decision of which backend a command talks to."""

from __future__ import annotations

import pytest
from elasticdl.jobs.config import ClientConfig, ServerSettings
from elasticdl.jobs.errors import NoJobServerError
from elasticdl.jobs.local_backend import LocalBackend
from elasticdl.jobs.lookup import JobLookup
from elasticdl.jobs.routing import backend_for, job_server, required_job_server
from elasticdl.jobs.server_backend import ServerBackend

SERVER = ClientConfig(namespace="team", server=ServerSettings(url="http://127.0.0.1:9", token="t"))


def test_a_configured_server_runs_every_job_unless_a_platform_is_named():
    backend = backend_for(config=SERVER)
    assert isinstance(backend, ServerBackend) and backend.client.url == "http://127.0.0.1:9"
    assert isinstance(backend_for("local", config=SERVER), LocalBackend)
    assert job_server(SERVER).url == "http://127.0.0.1:9"


def test_a_named_platform_takes_the_config_files_namespace():
    pytest.importorskip("kubernetes")
    from elasticdl.jobs.k8s_backend import KubernetesBackend

    config = ClientConfig(namespace="team", kube_context="ctx")
    backend = backend_for("kubernetes", config=config)
    assert isinstance(backend, KubernetesBackend)
    assert (backend.namespace, backend.kube_context) == ("team", "ctx")
    given = backend_for("kubernetes", "mine", "other", config=config)
    assert (given.namespace, given.kube_context) == ("mine", "other")


def test_without_server_or_platform_jobs_are_looked_up():
    backend = backend_for(config=ClientConfig(namespace="team"))
    assert isinstance(backend, JobLookup) and backend.namespace == "team"


def test_server_only_commands_say_what_needs_the_server():
    assert job_server(ClientConfig()) is None
    with pytest.raises(NoJobServerError, match="upload needs a job server; add 'server:"):
        required_job_server("upload", ClientConfig())
