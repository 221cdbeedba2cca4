"""elasticdl server (main.py): TLS with a given certificate (the SDK verifies it against the
configured CA; a self-signed certificate for 127.0.0.1 made with openssl here), one-line
errors for bad flags, add-user, and one server per state directory."""

import http.client
import subprocess
import sys
import time

import pytest
from elasticdl.jobs.errors import ClientError
from elasticdl.jobs.server_client import JobServerClient
from elasticdl.server.main import main as server_main
from elasticdl_testing.server_process import ServerProcess


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(d / "key.pem"),
            "-out",
            str(d / "cert.pem"),
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return d / "cert.pem", d / "key.pem"


def test_https_with_the_ca_and_nothing_else(tmp_path, certificate):
    cert, key = certificate
    server = ServerProcess(tmp_path / "state", None, f"--tls_cert={cert}", f"--tls_key={key}")
    token = server.add_user("alice")
    server.start()
    try:
        assert server.url.startswith("https://")
        assert JobServerClient(server.url, token, ca=str(cert)).version()["user"] == "alice"
        # Without the CA the certificate is not trusted.
        with pytest.raises(ClientError, match="TLS with the job server .* failed"):
            JobServerClient(server.url, token).version()
        # Plain HTTP gets no answer from the TLS port.
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        with pytest.raises((http.client.HTTPException, OSError)):
            conn.request("GET", "/v1/version", headers={"Authorization": f"Bearer {token}"})
            conn.getresponse().read()
    finally:
        server.stop()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--tls_cert=c.pem"], "--tls_cert and --tls_key go together"),
        (["--tls_cert=none.pem", "--tls_key=none.pem"], "--tls_cert 'none.pem' is not a file"),
        (["--port=70000"], "--port must be 0..65535"),
        (["--max_upload_mb=0"], "--max_upload_mb must be > 0"),
        (["--platform=mars"], "invalid choice: 'mars'"),
        (["--state_lock_timeout=-1"], "--state_lock_timeout must be 0..3600 seconds"),
        (["--max_connections=0"], "--max_connections must be 1..65536, got 0"),
        (["--header_timeout=0"], "--header_timeout must be in (0, 3600] seconds, got 0"),
        (["--body_timeout=-1"], "--body_timeout must be in (0, 3600] seconds, got -1"),
        (["--keep_alive_timeout=1e9"], "--keep_alive_timeout must be in (0, 3600] seconds"),
    ],
)
def test_bad_server_flags_are_one_line(tmp_path, capsys, flags, message):
    assert server_main([f"--state_dir={tmp_path / 'state'}", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "state").exists()


def test_add_user_prints_the_token_once(tmp_path, capsys):
    assert server_main(["add-user", "alice", f"--state_dir={tmp_path}"]) == 0
    out, err = capsys.readouterr()
    assert len(out.strip()) >= 40 and "shown only this once" in err
    assert server_main(["add-user", "alice", f"--state_dir={tmp_path}"]) == 2
    assert "user 'alice' exists; pass --replace" in capsys.readouterr().err
    assert server_main(["add-user", "Bad Name", f"--state_dir={tmp_path}"]) == 2
    assert "user name 'Bad Name' is invalid" in capsys.readouterr().err


def test_one_server_per_state_directory(tmp_path):
    first = ServerProcess(tmp_path / "state")
    first.start()
    try:
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "elasticdl.server.main",
                f"--state_dir={tmp_path / 'state'}",
                "--port=0",
            ],
            env=first.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 2
        assert "another server is running on --state_dir" in second.stderr
        assert second.stderr.count("\n") == 1
        first.kill()  # the kernel releases the lock of a killed server
        first.start()
    finally:
        first.stop()


def test_a_replacement_server_waits_for_the_state_directory(tmp_path):
    """--state_lock_timeout: a server started while its predecessor still stops (a replaced
    pod) waits for the lock instead of exiting, and serves once the predecessor is gone."""
    first = ServerProcess(tmp_path / "state")
    first.start()
    log = tmp_path / "second.log"
    with open(log, "wb") as out:
        second = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "elasticdl.server.main",
                f"--state_dir={tmp_path / 'state'}",
                "--port=0",
                "--state_lock_timeout=60",
            ],
            env=first.env,
            stdout=out,
            stderr=out,
        )
    try:

        def wait_for(text: str) -> None:
            deadline = time.monotonic() + 60
            while text not in log.read_text():
                assert second.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)

        wait_for("waiting up to 60 s for the server on --state_dir to stop")
        assert "listening on" not in log.read_text()
        first.kill()
        wait_for("listening on http://127.0.0.1:")
    finally:
        second.terminate()
        second.wait(timeout=30)
        first.stop()
