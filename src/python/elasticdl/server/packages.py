"""Model-zoo packages: tarballs checked, extracted atomically, kept by content hash.

``POST /v1/packages`` sends a tarball (gzip or plain) of a model-zoo directory: its members
are paths relative to the zoo's root (``mnist/mnist_functional_api.py``, ``requirements.txt``).
The package id is the tarball's sha256; the same bytes sent twice give the same package.
Only regular files and directories are accepted (a link or a device could point a job at
the server's own files), no member may leave the directory (absolute paths, ``..``), and
member paths have the bounds of data paths (``data_store.check_path_size``). What the file
system still refuses while extracting (a file ``a`` and then ``a/b``) is a 400 naming the path.
Extraction goes to a temporary directory that is renamed into place when complete, so a
package is either all there or not there at all.

A package is stored once however many users send its bytes, but each user reaches only the
packages they uploaded: ``<state_dir>/package-users/<id>/<user>`` records each uploader, and
another user's id reads exactly as an unknown one (404), so an id tells nothing of who has it.
A user who sends the same bytes gets their own access (201, as for a new package).
"""

from __future__ import annotations

import dataclasses
import errno
import re
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path, PurePosixPath
from typing import AsyncIterator

from elasticdl.server.data_store import check_path_size
from elasticdl.server.errors import BadRequest, NotFound, TooLarge
from elasticdl.server.uploads import PACKAGE_STAGING_PREFIX, receive
from fastapi.concurrency import run_in_threadpool

PACKAGE_ID = re.compile(r"[0-9a-f]{64}")
REQUIREMENTS = "requirements.txt"
# Extraction errors that are the server's (a full disk), not the package's: those stay 500.
SERVER_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ENOMEM, errno.EMFILE, errno.ENFILE}


@dataclasses.dataclass(frozen=True)
class PackageInfo:
    id: str
    files: int
    requirements: bool  # whether the zoo has a requirements.txt at its root

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class PackageStore:
    def __init__(
        self,
        root: Path,
        tmp_dir: Path,
        max_bytes: int,
        max_extracted_bytes: int,
        max_members: int,
        users_root: Path | None = None,
    ) -> None:
        self.root = root
        self.users_root = users_root or root.parent / "package-users"
        self.tmp_dir = tmp_dir
        self.max_bytes = max_bytes
        self.max_extracted_bytes = max_extracted_bytes
        self.max_members = max_members

    def path(self, package_id: str, *, user: str) -> Path:
        """The package's directory, if ``user`` uploaded it; NotFound alike for an unknown id
        and for another user's."""
        if not PACKAGE_ID.fullmatch(package_id or ""):
            raise NotFound(f"package {package_id!r} is not a package id (64 hex digits)")
        path = self.root / package_id
        if not (path.is_dir() and self.uploaded_by(package_id, user)):
            raise NotFound(f"no package {package_id}; upload it with POST /v1/packages")
        return path

    def uploaded_by(self, package_id: str, user: str) -> bool:
        return (self.users_root / package_id / user).is_file()

    def _record_uploader(self, package_id: str, user: str) -> None:
        # One empty file per uploader: concurrent uploads of the same bytes never race on
        # a shared record.
        (self.users_root / package_id).mkdir(parents=True, exist_ok=True)
        (self.users_root / package_id / user).touch()

    def info(self, package_id: str, *, user: str) -> PackageInfo:
        path = self.path(package_id, user=user)
        files = sum(1 for p in path.rglob("*") if p.is_file())
        return PackageInfo(package_id, files, (path / REQUIREMENTS).is_file())

    async def add(
        self, chunks: AsyncIterator[bytes], length: int | None, *, user: str
    ) -> tuple[PackageInfo, bool]:
        """Store a tarball as ``user``'s; returns its info and whether it is new to ``user``
        (not whether another user sent the same bytes before: that is theirs to know)."""
        received = await receive(chunks, self.tmp_dir, self.max_bytes, "the package", length)
        package_id = received.sha256
        try:
            if not (self.root / package_id).is_dir():
                await run_in_threadpool(self._extract, received.path, package_id)
        finally:
            received.path.unlink(missing_ok=True)
        new = not self.uploaded_by(package_id, user)
        self._record_uploader(package_id, user)
        return self.info(package_id, user=user), new

    # ---- checking and extracting ---------------------------------------------------------
    def _check(self, tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
        members = []
        total = 0
        try:
            for member in tar:
                members.append(member)
                name = member.name
                if len(members) > self.max_members:
                    raise TooLarge(f"the package has over {self.max_members} members")
                if name.startswith("/") or PurePosixPath(name).is_absolute():
                    raise BadRequest(
                        f"member {name!r} has an absolute path; tar the directory's contents with relative paths"
                    )
                if ".." in PurePosixPath(name).parts:
                    raise BadRequest(f"member {name!r} escapes the package directory with '..'")
                check_path_size(name, "member")
                if member.issym() or member.islnk():
                    raise BadRequest(
                        f"member {name!r} is a link; packages hold only files and directories (copy the target instead)"
                    )
                if not (member.isfile() or member.isdir()):
                    raise BadRequest(
                        f"member {name!r} is a device, FIFO or other special file; "
                        "packages hold only files and directories"
                    )
                total += member.size
                if total > self.max_extracted_bytes:
                    raise TooLarge(
                        f"the package extracts to over {self.max_extracted_bytes >> 20} MiB"
                    )
        except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
            raise BadRequest(
                f"the package is a truncated or corrupt tarball ({e}); send it again"
            ) from None
        if not any(m.isfile() for m in members):
            raise BadRequest("the package holds no files; tar the model-zoo directory")
        return members

    def _extract(self, tarball: Path, package_id: str) -> None:
        try:
            tar = tarfile.open(tarball, "r:*")
        except (tarfile.TarError, EOFError, zlib.error, OSError):
            raise BadRequest(
                "the body is not a tar archive (gzip or plain); send a tarball of the model-zoo directory"
            ) from None
        staging = Path(
            tempfile.mkdtemp(prefix=f"{PACKAGE_STAGING_PREFIX}{package_id[:12]}-", dir=self.tmp_dir)
        )
        try:
            with tar:
                members = self._check(tar)
                # The checks above give the reasons; the 'data' filter is the second line of
                # defence (and drops set-uid bits and odd modes).
                try:
                    _extract_members(tar, staging, members)
                except (tarfile.TarError, EOFError, zlib.error) as e:
                    raise BadRequest(
                        f"the package cannot be extracted ({e}); send it again"
                    ) from None
                except OSError as e:
                    if e.errno in SERVER_ERRNOS:
                        raise
                    raise BadRequest(_extraction_error(e, staging)) from None
            staging.chmod(0o755)
            try:
                staging.rename(self.root / package_id)
            except OSError:
                if not (self.root / package_id).is_dir():  # else: the same bytes won a race
                    raise
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)


def _extraction_error(e: OSError, staging: Path) -> str:
    """What went wrong writing the package's content, with the path as the package names it
    (not the server's directory)."""
    where = ""
    if e.filename:
        try:
            where = f" at {str(Path(e.filename).relative_to(staging))!r}"
        except ValueError:
            pass
    reason = f"the package cannot be extracted{where}: {e.strerror or e}"
    if e.errno in (errno.ENOTDIR, errno.EISDIR, errno.EEXIST):
        return reason + "; a path in it is a file or a directory, not both (e.g. 'a' and 'a/b')"
    return reason + "; send a tarball of plain files and directories"


def _extract_members(tar: tarfile.TarFile, staging: Path, members: list[tarfile.TarInfo]) -> None:
    if hasattr(tarfile, "data_filter"):
        tar.extractall(staging, members=members, filter="data")
        return
    # Python before 3.11.4 (Debian 12's 3.11.2, the Python of the server's image) has no
    # extraction filters. _check let only files and directories inside the package through;
    # what the 'data' filter does besides: no set-id or sticky bits, no group/other write,
    # owner read/write, never the archive's owner.
    for member in members:
        mode = member.mode & 0o755
        member.mode = mode | (0o700 if member.isdir() else 0o600)
        member.uid, member.gid, member.uname, member.gname = -1, -1, "", ""
    tar.extractall(staging, members=members)
