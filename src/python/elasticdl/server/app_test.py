"""The server's authentication and version route, over a real uvicorn process."""

import pytest
from elasticdl_testing.server_process import ServerProcess, request


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = ServerProcess(tmp_path_factory.mktemp("srv") / "state")
    server.tokens = {"alice": server.add_user("alice")}
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize(
    "path", ["/v1/version", "/v1/jobs", "/v1/openapi.json", "/v1/data/x", "/v1/packages/x"]
)
@pytest.mark.parametrize("header", [None, "Bearer nope", "Basic YWxpY2U6eA==", "Bearer "])
def test_every_route_needs_a_valid_token(server, path, header):
    headers = {"Authorization": header} if header is not None else {}
    status, body, got = request(server.port, "GET", path, headers=headers)
    assert status == 401 and got["www-authenticate"] == "Bearer"
    assert "token" in body["detail"] and "\n" not in body["detail"]


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json"])
def test_no_unauthenticated_documentation(server, path):
    """FastAPI's own pages are off: nothing there without a token (401), nor with one (404)."""
    assert request(server.port, "GET", path)[0] == 401
    assert request(server.port, "GET", path, server.tokens["alice"])[0] == 404


def test_version_and_openapi_with_a_token(server):
    status, body, _ = request(server.port, "GET", "/v1/version", server.tokens["alice"])
    assert status == 200 and body["api"] == "v1" and body["user"] == "alice"
    assert body["platform"] == "local" and body["server"]
    status, schema, _ = request(server.port, "GET", "/v1/openapi.json", server.tokens["alice"])
    assert status == 200 and "/v1/version" in schema["paths"]
    # What a client must know of job names: they are global, so 409 may be another user's.
    submit = schema["paths"]["/v1/jobs"]["post"]
    assert "Job names are global" in submit["description"]
    assert "another user's job" in submit["responses"]["409"]["description"]


def test_tokens_are_stored_hashed(server):
    text = (server.state_dir / "tokens.json").read_text()
    assert server.tokens["alice"] not in text
    assert (server.state_dir / "tokens.json").stat().st_mode & 0o777 == 0o600


def test_a_user_added_while_the_server_runs_can_log_in(server):
    token = server.add_user("bob")
    status, body, _ = request(server.port, "GET", "/v1/version", token)
    assert status == 200 and body["user"] == "bob"
