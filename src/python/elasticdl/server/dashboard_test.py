"""The dashboard's files and its metrics route, over a real server process on 127.0.0.1.
(What the pages show of real jobs, in a real browser: tests/python/elasticdl_tests/dashboard.)"""

import re

import pytest
from elasticdl.server.dashboard import CONTENT_SECURITY_POLICY, STATIC_TYPES
from elasticdl_testing.server_process import ServerProcess, request


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = ServerProcess(tmp_path_factory.mktemp("srv") / "state")
    server.token = server.add_user("alice")
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize("name", sorted(STATIC_TYPES))
def test_static_files_are_public_hold_no_data_and_carry_a_strict_policy(server, name):
    path = "/dashboard/" if name == "index.html" else f"/dashboard/{name}"
    status, body, headers = request(server.port, "GET", path)
    assert status == 200 and headers["content-type"] == STATIC_TYPES[name]
    assert headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert (
        "script-src 'self';" in CONTENT_SECURITY_POLICY and "unsafe" not in CONTENT_SECURITY_POLICY
    )
    assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY"
    assert "alice" not in body and server.token not in body
    if name.endswith(".html"):
        # Nothing the policy would block: no inline script, handler or style, no other origin.
        assert not re.search(r"<script(?![^>]*\bsrc=)", body)
        assert not re.search(r"\son[a-z]+\s*=", body) and "style=" not in body
        assert not re.search(r"(src|href)=\"(https?:)?//", body)


def test_unknown_files_and_the_way_in(server):
    assert request(server.port, "GET", "/dashboard/../tokens.json")[0] == 404
    status, body, _ = request(server.port, "GET", "/dashboard/secrets.txt")
    assert status == 404 and "no dashboard file" in body["detail"]
    for path in ("/", "/dashboard"):
        status, _, headers = request(server.port, "GET", path)
        assert status == 307 and headers["location"] == "/dashboard/"


def test_metrics_need_a_token_and_a_job_of_the_user(server):
    status, body, headers = request(server.port, "GET", "/v1/jobs/j1/metrics")
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    status, body, _ = request(server.port, "GET", "/v1/jobs/j1/metrics", server.token)
    assert status == 404 and body["detail"] == "no job named 'j1'; see GET /v1/jobs"
    other = server.add_user("bob")
    assert request(server.port, "GET", "/v1/jobs/j1/metrics", other)[0] == 404
    _, schema, _ = request(server.port, "GET", "/v1/openapi.json", server.token)
    assert "/v1/jobs/{name}/metrics" in schema["paths"]
