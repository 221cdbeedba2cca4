"""For tests and benchmarks: the job server as a real process on 127.0.0.1 (a free port)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import elasticdl
from elasticdl.server import main as _server_main  # noqa: F401  (the program it starts)

SRC = str(Path(elasticdl.__file__).resolve().parent.parent)


SERVER_ENTRY = ("elasticdl.server.main",)


class ServerProcess:
    """``python -m elasticdl.server.main --port=0`` with a given state directory. ``entry``:
    another module that runs the server (and its first arguments)."""

    def __init__(
        self,
        state_dir: Path,
        env: dict[str, str] | None = None,
        *flags: str,
        entry: Sequence[str] = SERVER_ENTRY,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.flags = list(flags)
        self.entry = list(entry)
        self.env = dict(os.environ if env is None else env)
        path = self.env.get("PYTHONPATH", "")
        self.env["PYTHONPATH"] = os.pathsep.join([SRC] + ([path] if path else []))
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log_path = self.state_dir.parent / f"{self.state_dir.name}-server.log"

    def add_user(self, name: str) -> str:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "elasticdl.server.main",
                "add-user",
                name,
                f"--state_dir={self.state_dir}",
            ],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return out.stdout.strip()

    def start(self, timeout: float = 60.0) -> "ServerProcess":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                *self.entry,
                f"--state_dir={self.state_dir}",
                "--port=0",
                "--log_level=warning",
                *self.flags,
            ],
            env=self.env,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            found = re.findall(r"listening on \w+://[^:]+:(\d+)", text)
            if found and self.proc.poll() is None:
                self.port = int(found[-1])
                if self._answers():
                    return self
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}:\n{text[-3000:]}")
            time.sleep(0.1)
        raise AssertionError(f"server did not start in {timeout}s:\n{self.log()[-3000:]}")

    @property
    def tls(self) -> bool:
        return any(f.startswith("--tls_cert") for f in self.flags)

    def _answers(self) -> bool:
        try:
            if self.tls:
                import ssl

                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE  # only: is it up yet?
                conn = http.client.HTTPSConnection(
                    "127.0.0.1", self.port, timeout=2, context=context
                )
            else:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            conn.request("GET", "/v1/version")
            conn.getresponse().read()
            conn.close()
            return True
        except OSError:
            return False

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as when the machine or the pod dies."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


def request(
    port: int,
    method: str,
    path: str,
    token: str | None = None,
    body: bytes | dict | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict | str, dict[str, str]]:
    """One request; returns the status, the JSON (or text) body and the headers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    all_headers = dict(headers or {})
    if token is not None:
        all_headers["Authorization"] = f"Bearer {token}"
    if isinstance(body, dict):
        body = json.dumps(body).encode()
        all_headers.setdefault("Content-Type", "application/json")
    conn.request(method, path, body=body, headers=all_headers)
    response = conn.getresponse()
    raw = response.read()
    conn.close()
    try:
        data: dict | str = json.loads(raw)
    except ValueError:
        data = raw.decode("utf-8", "replace")
    return response.status, data, {k.lower(): v for k, v in response.getheaders()}
