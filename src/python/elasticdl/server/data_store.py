"""Users' data files under ``<state_dir>/data/<user>/``: upload, download, checksums.

A path in the API (``PUT /v1/data/mnist/train/data-0.rd``) names a file below the user's own
data directory; jobs see that directory's paths (``--training_data=mnist/train``) and write
their checkpoints and outputs there too. A path never leaves it: no absolute paths, no ``..``,
and no symbolic link (a job could create one) is followed out of it.

An upload streams into a temporary file, is checked against the ``X-Content-SHA256`` header
when given, and is renamed into place only when complete: a reader sees the old file or the
new one, never half of one, and an interrupted upload can simply be sent again. The sha256
of each uploaded file is kept in ``data-sums/`` with the size and mtime it describes;
``GET`` returns it (computing it for files a job wrote).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path, PurePosixPath
from typing import AsyncIterator

from elasticdl.common.job_dir import write_atomically
from elasticdl.server.errors import BadRequest, Conflict, NotFound
from elasticdl.server.uploads import receive
from fastapi.concurrency import run_in_threadpool

CHECKSUM_HEADER = "X-Content-SHA256"


@dataclasses.dataclass(frozen=True)
class StoredFile:
    path: str  # as the user names it
    size: int
    sha256: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Bounds on a path a user names (data paths, a package's members): far above what a dataset
# or a model zoo needs, and below what the file system refuses (a name of over 255 bytes, a
# path of over 4096), so that such a path is a one-line 400, not an OSError from deep inside.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 1024
MAX_PATH_DEPTH = 32


def _shown(path: str) -> str:
    return repr(path if len(path) <= 60 else path[:57] + "...")


def check_path_size(path: str, what: str = "path") -> None:
    """The path's length, depth and each name's length within the bounds above."""
    size = len(path.encode("utf-8", "surrogatepass"))
    if size > MAX_PATH_BYTES:
        raise BadRequest(
            f"{what} {_shown(path)} is {size} bytes long; a path has at most {MAX_PATH_BYTES}"
        )
    parts = [p for p in path.split("/") if p]
    if len(parts) > MAX_PATH_DEPTH:
        raise BadRequest(
            f"{what} {_shown(path)} has {len(parts)} parts; a path has at most "
            f"{MAX_PATH_DEPTH} (its directories and its name)"
        )
    for part in parts:
        if len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
            raise BadRequest(
                f"{what}: the name {_shown(part)} is over {MAX_NAME_BYTES} bytes; use a "
                "shorter one"
            )


def check_relative_path(path: str, what: str = "path") -> PurePosixPath:
    """A relative path with no '..', '.', empty or control-character parts, within the
    bounds of ``check_path_size``."""
    check_path_size(path, what)
    if not path or path.startswith("/") or "\\" in path:
        raise BadRequest(
            f"{what} {path!r} must be a relative path below your data directory, e.g. mnist/train"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise BadRequest(f"{what} {path!r} contains control characters")
    parts = path.rstrip("/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise BadRequest(f"{what} {path!r} may not contain '..', '.' or empty parts")
    return PurePosixPath(*parts)


class DataStore:
    def __init__(self, root: Path, sums_root: Path, tmp_dir: Path, max_bytes: int) -> None:
        self.root = root
        self.sums_root = sums_root
        self.tmp_dir = tmp_dir
        self.max_bytes = max_bytes

    def user_root(self, user: str) -> Path:
        path = self.root / user
        path.mkdir(exist_ok=True)
        return path

    def resolve(self, user: str, path: str, what: str = "path") -> Path:
        """The absolute path of ``path`` in ``user``'s data directory (it need not exist)."""
        rel = check_relative_path(path, what)
        root = self.user_root(user).resolve()
        target = root.joinpath(*rel.parts)
        # Symbolic links inside the directory (a job may make some) must not lead out of it.
        if not target.resolve().is_relative_to(root):
            raise BadRequest(f"{what} {path!r} leads outside your data directory")
        return target

    # ---- upload --------------------------------------------------------------------------
    async def put(
        self,
        user: str,
        path: str,
        chunks: AsyncIterator[bytes],
        length: int | None,
        expected_sha256: str = "",
    ) -> StoredFile:
        target = self.resolve(user, path)
        expected = expected_sha256.strip().lower()
        if expected and (len(expected) != 64 or any(c not in "0123456789abcdef" for c in expected)):
            raise BadRequest(f"{CHECKSUM_HEADER} must be 64 hex digits, got {expected_sha256!r}")
        if target.is_dir():
            raise Conflict(f"{path!r} is a directory; upload files below it")
        received = await receive(chunks, self.tmp_dir, self.max_bytes, "the upload", length)
        try:
            if expected and received.sha256 != expected:
                raise BadRequest(
                    f"checksum mismatch: the body's sha256 is {received.sha256}, {CHECKSUM_HEADER} "
                    f"says {expected}; nothing was stored, send it again"
                )
            await run_in_threadpool(self._place, user, path, target, received.path, received.sha256)
        finally:
            received.path.unlink(missing_ok=True)
        return StoredFile(path, received.size, received.sha256)

    def _place(self, user: str, path: str, target: Path, tmp: Path, sha256: str) -> None:
        root = self.user_root(user).resolve()
        for parent in reversed(target.parents):
            if parent.is_relative_to(root) and parent.exists() and not parent.is_dir():
                rel = parent.relative_to(root)
                raise Conflict(f"{str(rel)!r} is a file; it cannot hold {path!r}")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
        st = target.stat()
        try:
            self._write_sum(
                user, path, {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
            )
        except OSError:
            pass  # GET computes it again

    def _sum_path(self, user: str, path: str) -> Path:
        sum_path = self.sums_root.joinpath(user, *check_relative_path(path).parts)
        return sum_path.with_name(sum_path.name + ".sha256")

    def _write_sum(self, user: str, path: str, record: dict) -> None:
        sum_path = self._sum_path(user, path)
        sum_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(sum_path, json.dumps(record))

    # ---- download ------------------------------------------------------------------------
    def checksum(self, user: str, path: str, target: Path) -> str:
        """The file's sha256: the recorded one if the file is unchanged since, else computed."""
        st = target.stat()
        try:
            record = json.loads(self._sum_path(user, path).read_text())
            if record.get("size") == st.st_size and record.get("mtime_ns") == st.st_mtime_ns:
                return str(record["sha256"])
        except (OSError, ValueError, KeyError):
            pass
        digest = hashlib.sha256()
        with open(target, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        try:
            self._write_sum(
                user,
                path,
                {"sha256": digest.hexdigest(), "size": st.st_size, "mtime_ns": st.st_mtime_ns},
            )
        except OSError:
            pass
        return digest.hexdigest()

    def lookup(self, user: str, path: str) -> Path:
        target = self.resolve(user, path)
        if not target.exists():
            raise NotFound(f"no file {path!r} in your data directory")
        return target

    def listing(self, user: str, path: str, target: Path) -> dict:
        entries = []
        for entry in sorted(target.iterdir()):
            if entry.is_symlink():
                continue
            if entry.is_dir():
                entries.append({"name": entry.name, "type": "dir"})
            elif entry.is_file():
                entries.append({"name": entry.name, "type": "file", "size": entry.stat().st_size})
        return {"path": path, "type": "dir", "entries": entries}
