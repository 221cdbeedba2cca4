"""Bad input to the job server: each case gets its 4xx with a one-line reason naming what is
wrong, and leaves nothing behind in the server's state directory (a real uvicorn process)."""

import gzip
import io
import os
import tarfile

import pytest
from elasticdl_testing.server_process import ServerProcess, request

ZOO_FILE = "mnist/model.py"


def tarball(*members: tuple[str, str, bytes], gz: bool = True) -> bytes:
    """members: (name, kind, data) with kind file/dir/symlink/hardlink/chr/fifo."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {
                "dir": tarfile.DIRTYPE,
                "symlink": tarfile.SYMTYPE,
                "hardlink": tarfile.LNKTYPE,
                "chr": tarfile.CHRTYPE,
                "fifo": tarfile.FIFOTYPE,
            }[kind]
            info.linkname = data.decode()
            tar.addfile(info)
    return gzip.compress(buf.getvalue()) if gz else buf.getvalue()


MIB = 1 << 20
DEEP = "a/" * 2000 + "x"  # 4 KB of request
LONG = "n" * 300
GOOD = tarball((ZOO_FILE, "file", b"def custom_model():\n    pass\n"))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = ServerProcess(
        tmp_path_factory.mktemp("srv") / "state", None, "--max_package_mb=1", "--max_upload_mb=1"
    )
    server.token = server.add_user("alice")
    server.start()
    status, body, _ = request(server.port, "POST", "/v1/packages", server.token, GOOD)
    assert status == 201, body
    server.package = body["id"]
    assert request(server.port, "GET", "/v1/data", server.token)[0] == 200  # makes data/alice
    # What a job of alice's could leave in her data directory for a TLS field to name.
    tls_dir = server.state_dir / "data" / "alice" / "tls"
    (tls_dir / "dir").mkdir(parents=True)
    os.mkfifo(tls_dir / "fifo")  # no writer: a blocking open for reading never returns
    (tls_dir / "zero").symlink_to("/dev/zero")
    yield server
    server.stop()


def snapshot(root):
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.name != "tokens.json" and "data-sums" not in p.parts
    )


def tls_job(cert: str):
    """A job whose TLS certificate is ``cert`` (read first of the three)."""
    return job({"tls_cert_file": cert, "tls_key_file": "tls/k.pem", "tls_ca_file": "tls/ca.pem"})


def job(spec=None, **extra):
    body = {
        "command": "train",
        "spec": {"job_name": "j1", "model_def": "mnist.model.custom_model", "training_data": "d"},
        "package": None,  # the fixture's package
    }
    body["spec"].update(spec or {})
    body.update(extra)
    return body


CASES = {
    # name: (method, path, body, headers, status, words in the reason)
    "package-not-a-tarball": (
        "POST",
        "/v1/packages",
        b"hello, not a tar",
        {},
        400,
        "not a tar archive",
    ),
    "package-truncated": (
        "POST",
        "/v1/packages",
        GOOD[: len(GOOD) // 2],
        {},
        400,
        "not a tar archive",
    ),
    "package-dotdot": (
        "POST",
        "/v1/packages",
        tarball(("a/../../evil.py", "file", b"x")),
        {},
        400,
        "escapes the package directory",
    ),
    "package-absolute": (
        "POST",
        "/v1/packages",
        tarball(("/etc/evil.py", "file", b"x")),
        {},
        400,
        "absolute path",
    ),
    "package-symlink": (
        "POST",
        "/v1/packages",
        tarball(("m.py", "file", b"x"), ("passwd", "symlink", b"/etc/passwd")),
        {},
        400,
        "is a link",
    ),
    "package-hardlink": (
        "POST",
        "/v1/packages",
        tarball(("m.py", "file", b"x"), ("h", "hardlink", b"m.py"), gz=False),
        {},
        400,
        "is a link",
    ),
    "package-device": (
        "POST",
        "/v1/packages",
        tarball(("m.py", "file", b"x"), ("tty", "chr", b"")),
        {},
        400,
        "device",
    ),
    "package-fifo": (
        "POST",
        "/v1/packages",
        tarball(("m.py", "file", b"x"), ("p", "fifo", b"")),
        {},
        400,
        "FIFO",
    ),
    # What the file system refuses while extracting: 400 with the member, never 500.
    "package-file-then-below-it": (
        "POST",
        "/v1/packages",
        tarball(("a", "file", b"x"), ("a/b", "file", b"y")),
        {},
        400,
        "the package cannot be extracted at 'a/b': Not a directory; a path in it is a file or "
        "a directory, not both",
    ),
    "package-file-over-a-directory": (
        "POST",
        "/v1/packages",
        tarball(("a/b", "file", b"x"), ("a", "file", b"y")),
        {},
        400,
        "the package cannot be extracted at 'a': Is a directory",
    ),
    "package-member-40-deep": (
        "POST",
        "/v1/packages",
        tarball(("a/" * 40 + "m.py", "file", b"x")),
        {},
        400,
        "has 41 parts; a path has at most 32",
    ),
    "package-member-300-char-name": (
        "POST",
        "/v1/packages",
        tarball((LONG + ".py", "file", b"x")),
        {},
        400,
        "is over 255 bytes",
    ),
    "package-over-limit": (
        "POST",
        "/v1/packages",
        b"\0" * (MIB + 1),
        {},
        413,
        "over the server's limit of 1 MiB",
    ),
    "data-over-limit": (
        "PUT",
        "/v1/data/big.bin",
        b"\0" * (MIB + 1),
        {},
        413,
        "over the server's limit",
    ),
    "data-dotdot": ("PUT", "/v1/data/a/../../x", b"x", {}, 400, "'..'"),
    "data-dotdot-encoded": ("PUT", "/v1/data/a/%2e%2e/%2e%2e/x", b"x", {}, 400, "'..'"),
    "data-bad-checksum": (
        "PUT",
        "/v1/data/f.bin",
        b"abc",
        {"X-Content-SHA256": "0" * 64},
        400,
        "checksum mismatch",
    ),
    "data-checksum-not-hex": (
        "PUT",
        "/v1/data/f.bin",
        b"abc",
        {"X-Content-SHA256": "zz"},
        400,
        "64 hex digits",
    ),
    # Lengths and depths the file system would refuse deep inside (a recursion through 2,000
    # directories, a name over 255 bytes): one line, 400, no traceback in the server's log.
    "data-2000-deep": ("PUT", "/v1/data/" + DEEP, b"x", {}, 400, "a path has at most 1024"),
    "data-get-2000-deep": ("GET", "/v1/data/" + DEEP, None, {}, 400, "a path has at most 1024"),
    "data-40-deep": (
        "PUT",
        "/v1/data/" + "a/" * 40 + "x",
        b"x",
        {},
        400,
        "has 41 parts; a path has at most 32",
    ),
    "data-300-char-name": ("PUT", "/v1/data/" + LONG, b"x", {}, 400, "is over 255 bytes"),
    "data-get-300-char-name": ("GET", "/v1/data/" + LONG, None, {}, 400, "is over 255 bytes"),
    "data-missing": ("GET", "/v1/data/nothing/here", None, {}, 404, "no file 'nothing/here'"),
    "job-malformed-json": (
        "POST",
        "/v1/jobs",
        b'{"command": "train", ',
        {"Content-Type": "application/json"},
        400,
        "malformed JSON",
    ),
    "job-unknown-field": ("POST", "/v1/jobs", job(colour="red"), {}, 422, "unknown field 'colour'"),
    "job-missing-spec": ("POST", "/v1/jobs", {"command": "train"}, {}, 422, "'spec' is required"),
    "job-unknown-spec-field": (
        "POST",
        "/v1/jobs",
        job({"num_worker": 2}),
        {},
        422,
        "num_worker is not a job parameter; did you mean num_workers?",
    ),
    "job-bad-value": ("POST", "/v1/jobs", job({"minibatch_size": -1}), {}, 422, "minibatch_size"),
    "job-bad-type": (
        "POST",
        "/v1/jobs",
        job({"num_workers": "2"}),
        {},
        422,
        "num_workers must be an integer",
    ),
    "job-bad-name": ("POST", "/v1/jobs", job({"job_name": "Bad_Name"}), {}, 422, "job_name"),
    "job-bad-command": (
        "POST",
        "/v1/jobs",
        job(command="fly"),
        {},
        422,
        "command 'fly' is invalid",
    ),
    "job-model-zoo": (
        "POST",
        "/v1/jobs",
        job({"model_zoo": "/etc"}),
        {},
        422,
        "spec.model_zoo cannot be set",
    ),
    "job-data-escapes": (
        "POST",
        "/v1/jobs",
        job({"training_data": "../bob/data"}),
        {},
        422,
        "spec.training_data",
    ),
    "job-data-absolute": ("POST", "/v1/jobs", job({"output": "/tmp/out"}), {}, 422, "spec.output"),
    # The TLS files are read on the server during submit: only from the user's data
    # directory, only regular files (a FIFO would hang a worker thread, /dev/zero fill memory).
    "job-tls-absolute": (
        "POST",
        "/v1/jobs",
        tls_job("/dev/zero"),
        {},
        422,
        "spec.tls_cert_file '/dev/zero' must be a relative path below your data directory",
    ),
    "job-tls-symlink-out": (
        "POST",
        "/v1/jobs",
        tls_job("tls/zero"),
        {},
        422,
        "spec.tls_cert_file 'tls/zero' leads outside your data directory",
    ),
    "job-tls-fifo": (
        "POST",
        "/v1/jobs",
        tls_job("tls/fifo"),
        {},
        422,
        "--tls_cert_file 'tls/fifo': no readable regular file there",
    ),
    "job-tls-dotdot": (
        "POST",
        "/v1/jobs",
        tls_job("../bob/tls/job.pem"),
        {},
        422,
        "spec.tls_cert_file '../bob/tls/job.pem' may not contain '..'",
    ),
    "job-data-2000-deep": (
        "POST",
        "/v1/jobs",
        job({"training_data": DEEP}),
        {},
        422,
        "spec.training_data 'a/a/a/",
    ),
    "job-output-300-char-name": (
        "POST",
        "/v1/jobs",
        job({"output": "out/" + LONG}),
        {},
        422,
        "spec.output: the name 'nnn",
    ),
    "job-300-char-job-name": (
        "POST",
        "/v1/jobs",
        job({"job_name": LONG}),
        {},
        422,
        "is 300 characters; use at most 40",
    ),
    "job-no-package": ("POST", "/v1/jobs", job(package=""), {}, 422, "package is required"),
    "job-unknown-package": ("POST", "/v1/jobs", job(package="f" * 64), {}, 422, "no package"),
    "job-missing-data": ("POST", "/v1/jobs", job(), {}, 422, "--training_data 'd' does not exist"),
    "job-unknown-model": (
        "POST",
        "/v1/jobs",
        job({"model_def": "mnist.nope.f"}),
        {},
        422,
        "--model_def 'mnist.nope.f'",
    ),
    "job-body-too-large": (
        "POST",
        "/v1/jobs",
        job({"envs": "A=" + "x" * (1 << 20)}),
        {},
        413,
        "the request body is over the server's limit of 1024 KiB",
    ),
    "job-unknown": ("GET", "/v1/jobs/nobody", None, {}, 404, "no job named 'nobody'"),
    "job-300-char-name": ("GET", "/v1/jobs/" + LONG, None, {}, 400, "is not a job name"),
    "cancel-300-char-name": ("DELETE", "/v1/jobs/" + LONG, None, {}, 400, "is not a job name"),
    "logs-300-char-name": ("GET", f"/v1/jobs/{LONG}/logs", None, {}, 400, "is not a job name"),
    "metrics-300-char-name": (
        "GET",
        f"/v1/jobs/{LONG}/metrics",
        None,
        {},
        400,
        "is not a job name",
    ),
    "job-name-not-a-name": ("GET", "/v1/jobs/Bad_Name", None, {}, 400, "is not a job name"),
    "package-300-char-id": ("GET", "/v1/packages/" + LONG, None, {}, 404, "is not a package id"),
    "cancel-unknown": ("DELETE", "/v1/jobs/nobody", None, {}, 404, "no job named 'nobody'"),
    "logs-unknown": ("GET", "/v1/jobs/nobody/logs", None, {}, 404, "no job named 'nobody'"),
    "logs-tail-and-follow": (
        "GET",
        "/v1/jobs/nobody/logs?tail=5&follow=true",
        None,
        {},
        400,
        "tail: give either tail",
    ),
    "logs-tail-negative": ("GET", "/v1/jobs/nobody/logs?tail=-1", None, {}, 422, "tail"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input(server, case):
    method, path, body, headers, status, words = CASES[case]
    if isinstance(body, dict) and body.get("package", "") is None:
        body = dict(body, package=server.package)
    before = snapshot(server.state_dir)
    tracebacks = server.log().count("Traceback")
    got, reply, _ = request(server.port, method, path, server.token, body, headers)
    assert got == status, reply
    reason = reply["detail"]
    assert isinstance(reason, str) and "\n" not in reason and words in reason, reason
    assert len(reason) < 500, reason
    assert snapshot(server.state_dir) == before
    assert not any((server.state_dir / "tmp").iterdir())
    # Answered after the case's request has finished, its logging included.
    assert request(server.port, "GET", "/v1/version", server.token)[0] == 200
    assert server.log().count("Traceback") == tracebacks


def test_a_missing_tls_file_and_an_unreadable_one_read_the_same(server):
    """No oracle: the reply does not tell whether a path exists (tls/dir cannot be read as a
    file; the server runs as root here, so a mode does not stop it)."""
    replies = []
    for name in ("tls/none.pem", "tls/dir"):
        body = dict(tls_job(name), package=server.package)
        status, reply, _ = request(server.port, "POST", "/v1/jobs", server.token, body)
        assert status == 422, reply
        replies.append(reply["detail"].replace(repr(name), "NAME"))
    assert replies[0] == replies[1], replies
    assert "no readable regular file there" in replies[0]


def test_another_users_package_is_an_unknown_id_to_them(server):
    """Packages are stored once by content, but each user reaches only what they uploaded:
    bob's replies for alice's package id are those for an id nobody has."""
    bob = server.add_user("bob")
    theirs, nobodys = server.package, "f" * 64

    def reply(method, path, body=None):
        status, got, _ = request(server.port, method, path, bob, body)
        text = got["detail"] if isinstance(got, dict) and "detail" in got else got
        return status, str(text).replace(theirs, "ID").replace(nobodys, "ID")

    for method, path, body in (
        ("GET", "/v1/packages/{}", None),
        ("POST", "/v1/jobs", job(package="{}")),
    ):
        got = []
        for package_id in (theirs, nobodys):
            if body is None:
                got.append(reply(method, path.format(package_id)))
            else:
                got.append(reply(method, path, dict(body, package=package_id)))
        assert got[0] == got[1], got
        assert got[0][0] in (404, 422) and "no package ID; upload it" in got[0][1], got
    # The same bytes from bob: his own access (201, as for any new package), one copy stored.
    status, info, _ = request(server.port, "POST", "/v1/packages", bob, GOOD)
    assert status == 201 and info["id"] == theirs
    assert request(server.port, "GET", f"/v1/packages/{theirs}", bob)[0] == 200
    assert request(server.port, "POST", "/v1/packages", server.token, GOOD)[0] == 200
    assert [p.name for p in (server.state_dir / "packages").iterdir()] == [theirs]


def test_job_body_without_length_is_capped_too(server):
    """A chunked body (no Content-Length) is read only up to the limit, then refused."""
    import http.client
    import json

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    chunks = iter([b'{"spec": {"envs": "'] + [b"x" * 65536] * 20 + [b'"}}'])
    headers = {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"}
    conn.request("POST", "/v1/jobs", body=chunks, headers=headers, encode_chunked=True)
    response = conn.getresponse()
    reason = json.loads(response.read())["detail"]
    conn.close()
    assert response.status == 413 and "over the server's limit" in reason
