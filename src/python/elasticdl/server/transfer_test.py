"""Packages and data through a real server process and the SDK: checksums, resumed downloads,
uploads interrupted by the client going away or by the server being killed."""

import hashlib
import os
import socket
import time

import pytest
from elasticdl.jobs.errors import ClientError
from elasticdl.jobs.server_client import JobServerClient
from elasticdl_testing.server_process import ServerProcess, request


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = ServerProcess(tmp_path_factory.mktemp("srv") / "state")
    server.tokens = {u: server.add_user(u) for u in ("alice", "bob")}
    server.start()
    yield server
    server.stop()


def client(server, user="alice"):
    return JobServerClient(server.url, server.tokens[user])


def test_package_upload_is_keyed_by_content_and_skipped_when_known(server, tmp_path):
    zoo = tmp_path / "zoo"
    (zoo / "mnist").mkdir(parents=True)
    (zoo / "mnist" / "model.py").write_text("def custom_model():\n    pass\n")
    (zoo / "requirements.txt").write_text("")
    (zoo / "mnist" / "__pycache__").mkdir()
    (zoo / "mnist" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"x")
    seen = []
    package = client(server).upload_package(zoo, progress=lambda *a: seen.append(a))
    extracted = server.state_dir / "packages" / package
    assert (extracted / "mnist" / "model.py").read_text().startswith("def custom_model")
    assert not (extracted / "mnist" / "__pycache__").exists()
    assert seen and seen[-1][0] == seen[-1][1]
    # The same directory gives the same bytes: no second upload by alice. Bob cannot see her
    # package, so his client sends it; he gets the same id, and the server keeps one copy.
    seen.clear()
    assert client(server).upload_package(zoo, progress=lambda *a: seen.append(a)) == package
    assert seen == []
    status, _, _ = request(server.port, "GET", f"/v1/packages/{package}", server.tokens["bob"])
    assert status == 404
    stored = sorted((server.state_dir / "packages").iterdir())
    assert client(server, "bob").upload_package(zoo, progress=lambda *a: seen.append(a)) == package
    assert seen and seen[-1][0] == seen[-1][1]
    status, info, _ = request(server.port, "GET", f"/v1/packages/{package}", server.tokens["bob"])
    assert status == 200 and info == {"id": package, "files": 2, "requirements": True}
    assert sorted((server.state_dir / "packages").iterdir()) == stored


def test_upload_download_directory_with_checksums(server, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    files = {"a.bin": os.urandom(3 << 20), "sub/b.txt": b"hello\n", "empty": b""}
    for name, data in files.items():
        (src / name).write_bytes(data)
    stored = client(server).upload(src, "set1")
    assert {s["path"]: s["sha256"] for s in stored} == {
        f"set1/{n}": hashlib.sha256(d).hexdigest() for n, d in files.items()
    }
    status, body, headers = request(
        server.port, "GET", "/v1/data/set1/sub/b.txt", server.tokens["alice"]
    )
    assert status == 200 and body == "hello\n"
    assert headers["x-content-sha256"] == hashlib.sha256(b"hello\n").hexdigest()

    dest = tmp_path / "dest"
    client(server).download("set1", dest)
    for name, data in files.items():
        assert (dest / name).read_bytes() == data
    # Each user has their own data directory.
    with pytest.raises(ClientError, match="no file 'set1'"):
        client(server, "bob").download("set1", tmp_path / "bob")


def test_download_resumes_from_the_part_on_disk(server, tmp_path):
    data = os.urandom(2 << 20)
    (tmp_path / "f").write_bytes(data)
    client(server).upload(tmp_path / "f", "resume/f")
    status, body, headers = request(
        server.port,
        "GET",
        "/v1/data/resume/f",
        server.tokens["alice"],
        headers={"Range": "bytes=1000-"},
    )
    assert status == 206 and headers["content-range"] == f"bytes 1000-{len(data) - 1}/{len(data)}"
    dest = tmp_path / "out" / "f"
    dest.parent.mkdir()
    (dest.parent / "f.part").write_bytes(data[:12345])  # what an interrupted download left
    seen = []
    client(server).download("resume/f", dest, progress=lambda d, t, n: seen.append((d, t)))
    assert dest.read_bytes() == data and not (dest.parent / "f.part").exists()
    assert seen[0][0] > 12345 and seen[-1] == (len(data), len(data))
    # A part that does not match the file is detected by the checksum and not kept.
    (dest.parent / "g.part").write_bytes(b"\0" * 100)
    with pytest.raises(ClientError, match="sha256 differs"):
        client(server).download("resume/f", dest.parent / "g")
    assert not (dest.parent / "g.part").exists() and not (dest.parent / "g").exists()


def _send_partial(port, token, path, total, sent):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        (
            f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Length: {total}\r\n\r\n"
        ).encode()
        + b"x" * sent
    )
    return sock


def _leftovers(server):
    return [p for p in (server.state_dir / "tmp").iterdir()]


def test_interrupted_upload_leaves_nothing_and_can_be_retried(server, tmp_path):
    old = tmp_path / "old"
    old.write_bytes(b"the previous version\n")
    client(server).upload(old, "int/file")
    sock = _send_partial(
        server.port, server.tokens["alice"], "/v1/data/int/file", 10 << 20, 1 << 20
    )
    time.sleep(0.5)
    sock.close()  # the client goes away mid-upload
    deadline = time.monotonic() + 10
    while _leftovers(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _leftovers(server) == []
    assert (
        server.state_dir / "data" / "alice" / "int" / "file"
    ).read_bytes() == b"the previous version\n"
    new = tmp_path / "new"
    new.write_bytes(os.urandom(10 << 20))
    client(server).upload(new, "int/file")
    assert (server.state_dir / "data" / "alice" / "int" / "file").read_bytes() == new.read_bytes()


def test_upload_interrupted_by_a_killed_server_can_be_retried(tmp_path):
    server = ServerProcess(tmp_path / "state")
    token = server.add_user("alice")
    server.start()
    try:
        sock = _send_partial(server.port, token, "/v1/data/k/file", 10 << 20, 2 << 20)
        deadline = time.monotonic() + 10
        while not _leftovers(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _leftovers(server), "the upload never started"
        server.kill()
        sock.close()
        assert not (server.state_dir / "data" / "alice" / "k").exists()
        server.start()  # a new server: same state dir, new port
        assert _leftovers(server) == []
        src = tmp_path / "file"
        src.write_bytes(os.urandom(10 << 20))
        JobServerClient(server.url, token).upload(src, "k/file")
        assert (server.state_dir / "data" / "alice" / "k" / "file").read_bytes() == src.read_bytes()
    finally:
        server.stop()


def test_chunked_upload_over_the_limit_is_refused(tmp_path):
    server = ServerProcess(tmp_path / "state", None, "--max_upload_mb=1")
    token = server.add_user("alice")
    server.start()
    try:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        body = (b"y" * 65536 for _ in range(40))  # no Content-Length: counted as it comes
        conn.request(
            "PUT",
            "/v1/data/big",
            body=body,
            headers={"Authorization": f"Bearer {token}"},
            encode_chunked=True,
        )
        response = conn.getresponse()
        assert response.status == 413 and b"over the server's limit of 1 MiB" in response.read()
        assert not (server.state_dir / "data" / "alice" / "big").exists()
        assert _leftovers(server) == []
    finally:
        server.stop()
