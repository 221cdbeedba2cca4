"""A typed client of the ElasticDL job server (``elasticdl server``), standard library only.

    from elasticdl.jobs.server_client import JobServerClient

    client = JobServerClient("https://edl.example.com:8443", token, ca="ca.pem")
    client.upload("data/fashion_mnist", "fashion_mnist")          # a directory, file by file
    status = client.submit_job(spec, package_dir="model_zoo")      # spec paths: in your data dir
    for chunk in client.tail_logs(spec.job_name, follow=True):
        print(chunk, end="")
    client.wait(spec.job_name)

Errors are :class:`~elasticdl.jobs.errors.ClientError` subclasses with the server's one-line
reason (``JobNotFoundError`` for 404, ``JobConflictError`` for 409). Uploads and downloads are
streamed, verified by sha256 (``X-Content-SHA256``), and a download resumes from the part
already on disk (``<dest>.part``).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import ssl
import urllib.parse
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Mapping

from elasticdl.common.job_status import JobStatus
from elasticdl.common.text_chunks import decoded_chunks
from elasticdl.jobs.backend import Progress, wait_until_final
from elasticdl.jobs.errors import ClientError, JobConflictError, JobNotFoundError
from elasticdl.jobs.job_request import JobRequest

CHUNK = 1 << 20
CHECKSUM_HEADER = "X-Content-SHA256"


class ServerRequestError(ClientError):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class ServerAuthError(ServerRequestError):
    pass


def _quote(path: str) -> str:
    return urllib.parse.quote(path.strip("/"), safe="/")


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class JobServerClient:
    def __init__(self, url: str, token: str, ca: str = "", timeout: float = 300.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ClientError(f"server url {url!r} is invalid; use http(s)://HOST:PORT")
        if not token:
            raise ClientError("no server token; add server.token to the config file")
        self.url = url.rstrip("/")
        self._scheme = parsed.scheme
        self._host = parsed.hostname
        self._port = parsed.port
        self._base = parsed.path.rstrip("/")
        self._token = token
        self._timeout = timeout
        self._ssl: ssl.SSLContext | None = None
        if parsed.scheme == "https":
            if ca and not os.path.isfile(os.path.expanduser(ca)):
                raise ClientError(
                    f"server ca {ca!r} is not a file; fix server.ca in the config file"
                )
            self._ssl = ssl.create_default_context(cafile=os.path.expanduser(ca) if ca else None)

    @classmethod
    def from_config(cls, config=None) -> "JobServerClient":
        from elasticdl.jobs.config import load_config

        config = config or load_config()
        if config.server is None:
            raise ClientError(
                "no job server configured; add 'server: {url: ..., token: ...}' to "
                f"{config.path or 'the config file (~/.elasticdl/config.yaml)'}"
            )
        return cls(config.server.url, config.server.token, config.server.ca)

    # ---- plumbing ------------------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        if self._scheme == "https":
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=self._timeout, context=self._ssl
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)

    def _send(
        self,
        method: str,
        path: str,
        body: bytes | BinaryIO | None = None,
        headers: Mapping[str, str] | None = None,
        length: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        conn = self._connection()
        try:
            conn.putrequest(method, self._base + path, skip_accept_encoding=True)
            conn.putheader("Authorization", f"Bearer {self._token}")
            for key, value in (headers or {}).items():
                conn.putheader(key, value)
            if isinstance(body, bytes):
                length = len(body)
            if body is not None:
                conn.putheader("Content-Length", str(length))
            conn.endheaders()
            if isinstance(body, bytes):
                conn.send(body)
            elif body is not None:
                sent = 0
                try:
                    while chunk := body.read(CHUNK):
                        conn.send(chunk)
                        sent += len(chunk)
                        if progress:
                            progress(sent)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the server refused it early: its answer says why
            response = conn.getresponse()
        except ssl.SSLError as e:
            conn.close()
            raise ClientError(
                f"TLS with the job server at {self.url} failed: {e.reason}; check server.ca"
            ) from None
        except OSError as e:
            conn.close()
            raise ClientError(
                f"cannot reach the job server at {self.url} ({e.strerror or e}); check server.url"
            ) from None
        if response.status >= 400:
            raw = response.read()
            conn.close()
            try:
                reason = json.loads(raw).get("detail") or ""
            except (ValueError, AttributeError):
                reason = ""
            reason = str(reason or raw[:200].decode("utf-8", "replace") or response.reason)
            if response.status == 401:
                raise ServerAuthError(401, f"the job server refused the token: {reason}")
            if response.status == 404 and path.startswith("/v1/jobs/"):
                raise JobNotFoundError(reason)
            if response.status == 409:
                raise JobConflictError(reason)
            raise ServerRequestError(response.status, reason)
        return conn, response

    def _json(self, method: str, path: str, payload: Any = None) -> Any:
        body = None if payload is None else json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn, response = self._send(method, path, body, headers)
        try:
            return json.loads(response.read())
        finally:
            conn.close()

    # ---- server --------------------------------------------------------------------------
    def version(self) -> dict:
        return self._json("GET", "/v1/version")

    # ---- packages and jobs ---------------------------------------------------------------
    def upload_package(
        self, package_dir: str | os.PathLike, progress: Progress | None = None
    ) -> str:
        """Upload a model-zoo directory (skipped when the server has the same bytes)."""
        from elasticdl.jobs.packaging import package_tarball

        with package_tarball(package_dir) as tarball:
            digest = hashlib.sha256()
            while chunk := tarball.read(CHUNK):
                digest.update(chunk)
            size = tarball.tell()
            package_id = digest.hexdigest()
            try:
                self._json("GET", f"/v1/packages/{package_id}")
                return package_id
            except ServerRequestError as e:
                if e.status != 404:
                    raise
            tarball.seek(0)
            name = os.path.basename(os.path.abspath(package_dir))
            report = (lambda done: progress(done, size, name)) if progress else None
            conn, response = self._send(
                "POST",
                "/v1/packages",
                tarball,
                {"Content-Type": "application/gzip"},
                length=size,
                progress=report,
            )
            with contextlib.closing(conn):
                return json.loads(response.read())["id"]

    def submit_job(
        self,
        spec: Any,
        package_dir: str | os.PathLike | None = None,
        command: str = "train",
        package_id: str = "",
        image: str = "",
        progress: Progress | None = None,
    ) -> JobStatus:
        """Submit ``spec`` (a ``JobSpec`` or a dict of its fields); its data and output paths
        are paths in your data directory on the server. ``package_dir`` is uploaded first."""
        if package_dir is not None:
            package_id = self.upload_package(package_dir, progress)
        request = JobRequest.of(spec, command, package_id, image)
        return JobStatus.from_dict(self._json("POST", "/v1/jobs", request.to_json()))

    def list_jobs(self) -> list[JobStatus]:
        return [JobStatus.from_dict(j) for j in self._json("GET", "/v1/jobs")["jobs"]]

    def get_job_status(self, name: str) -> JobStatus:
        return JobStatus.from_dict(self._json("GET", f"/v1/jobs/{_quote(name)}"))

    def stop_job(self, name: str) -> JobStatus:
        return JobStatus.from_dict(self._json("DELETE", f"/v1/jobs/{_quote(name)}"))

    def tail_logs(
        self, name: str, replica: str = "master", follow: bool = False, tail: int = 0
    ) -> Iterator[str]:
        """The replica's log in chunks; ``follow``: until the job ends; ``tail`` > 0: only its
        last ``tail`` lines as they are now."""
        query = urllib.parse.urlencode(
            {"replica": replica, "follow": "true" if follow else "false", "tail": tail}
        )
        conn, response = self._send("GET", f"/v1/jobs/{_quote(name)}/logs?{query}")
        return self._text_chunks(conn, response)

    @staticmethod
    def _text_chunks(conn, response) -> Iterator[str]:
        try:
            yield from decoded_chunks(iter(lambda: response.read1(65536), b""))
        finally:
            conn.close()

    def wait(
        self, name: str, timeout: float | None = None, poll_interval: float = 1.0
    ) -> JobStatus:
        return wait_until_final(self.get_job_status, name, timeout, poll_interval)

    # ---- data ----------------------------------------------------------------------------
    def upload(
        self, src: str | os.PathLike, dest: str, progress: Progress | None = None
    ) -> list[dict]:
        """Upload a file, or a directory file by file, to ``dest`` in your data directory."""
        src_path = Path(src).expanduser()
        if src_path.is_dir():
            pairs = [
                (p, f"{dest.strip('/')}/{p.relative_to(src_path).as_posix()}")
                for p in sorted(src_path.rglob("*"))
                if p.is_file() and not any(part in (".git", "__pycache__") for part in p.parts)
            ]
        elif src_path.is_file():
            pairs = [(src_path, dest.strip("/"))]
        else:
            raise ClientError(f"{str(src)!r} is neither a file nor a directory")
        total = sum(p.stat().st_size for p, _ in pairs)
        done = 0
        stored = []
        for path, target in pairs:
            size = path.stat().st_size
            sha256 = _sha256_of(path)
            report = (
                (lambda n, base=done, name=target: progress(base + n, total, name))
                if progress
                else None
            )
            with open(path, "rb") as f:
                conn, response = self._send(
                    "PUT",
                    f"/v1/data/{_quote(target)}",
                    f,
                    {CHECKSUM_HEADER: sha256, "Content-Type": "application/octet-stream"},
                    length=size,
                    progress=report,
                )
            with contextlib.closing(conn):
                stored.append(json.loads(response.read()))
            done += size
            if progress and size == 0:
                progress(done, total, target)
        return stored

    def list_data(self, path: str = "") -> dict:
        return self._json("GET", f"/v1/data/{_quote(path)}" if path.strip("/") else "/v1/data")

    def download(
        self, src: str, dest: str | os.PathLike, progress: Progress | None = None
    ) -> list[str]:
        """Download a file, or a directory recursively, from your data directory."""
        conn, response = self._send("GET", f"/v1/data/{_quote(src)}", headers={"Accept": "*/*"})
        if response.getheader("Content-Type", "").startswith("application/json"):
            listing = json.loads(response.read())
            conn.close()
            files = []
            for entry in listing["entries"]:
                files += self.download(
                    f"{src.strip('/')}/{entry['name']}", Path(dest) / entry["name"], progress
                )
            return files
        conn.close()
        return [self._download_file(src, Path(dest).expanduser(), progress)]

    def _download_file(self, src: str, dest: Path, progress: Progress | None) -> str:
        part = dest.with_name(dest.name + ".part")
        dest.parent.mkdir(parents=True, exist_ok=True)
        start = part.stat().st_size if part.exists() else 0
        headers = {"Range": f"bytes={start}-"} if start else {}
        try:
            conn, response = self._send("GET", f"/v1/data/{_quote(src)}", headers=headers)
        except ServerRequestError as e:
            if e.status != 416:
                raise
            part.unlink()  # longer than the file is now: start again
            start = 0
            conn, response = self._send("GET", f"/v1/data/{_quote(src)}")
        with contextlib.closing(conn):
            if response.status != 206:
                start = 0  # the server sent the whole file
            total = start + int(response.getheader("Content-Length") or 0)
            expected = response.getheader(CHECKSUM_HEADER, "")
            done = start
            with open(part, "ab" if start else "wb") as f:
                while chunk := response.read(CHUNK):
                    f.write(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done, total, src)
        if expected and _sha256_of(part) != expected:
            part.unlink()
            raise ClientError(
                f"{src}: the download's sha256 differs from the server's; run it again"
            )
        os.replace(part, dest)
        return str(dest)
