"""Receiving a request body into a temporary file: size-capped and hashed as it streams.

The file lives in the server's ``tmp/`` (same filesystem as the stores, so the final
``rename`` is atomic) and is removed when anything goes wrong, the client going away
included. Whatever a killed server leaves in ``tmp/`` is removed when the next one starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import AsyncIterator

from elasticdl.server.errors import BadRequest, TooLarge

BATCH_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class Received:
    path: Path
    size: int
    sha256: str


# Names of what the server writes into tmp/ (uploads here, package staging in packages.py).
UPLOAD_PREFIX = "upload-"
PACKAGE_STAGING_PREFIX = "package-"
TMP_PREFIXES = (UPLOAD_PREFIX, PACKAGE_STAGING_PREFIX)


def _mib(n: int) -> str:
    return f"{n >> 20} MiB" if n and n % (1 << 20) == 0 else f"{n} bytes"


def declared_length(header: str | None, limit: int, what: str) -> int | None:
    """The Content-Length, refusing one over ``limit`` before any byte is read."""
    if header is None:
        return None
    try:
        length = int(header)
    except ValueError:
        raise BadRequest(f"Content-Length {header!r} is not a number") from None
    if length > limit:
        raise TooLarge(f"{what} of {_mib(length)} is over the server's limit of {_mib(limit)}")
    return length


async def receive(
    chunks: AsyncIterator[bytes], tmp_dir: Path, limit: int, what: str, length: int | None
) -> Received:
    """Write the body to a temporary file; the event loop keeps reading the next megabyte
    while a worker thread hashes and writes the last one (both release the GIL)."""
    loop = asyncio.get_running_loop()
    fd, name = tempfile.mkstemp(prefix=UPLOAD_PREFIX, dir=tmp_dir)
    path = Path(name)
    digest = hashlib.sha256()
    size = 0
    pending: asyncio.Future | None = None
    batch: list[bytes] = []
    batched = 0

    def write(data: bytes) -> None:
        digest.update(data)
        f.write(data)

    try:
        with os.fdopen(fd, "wb") as f:
            try:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > limit:
                        raise TooLarge(f"{what} is over the server's limit of {_mib(limit)}")
                    batch.append(chunk)
                    batched += len(chunk)
                    if batched >= BATCH_BYTES:
                        if pending is not None:
                            await pending
                        pending = loop.run_in_executor(None, write, b"".join(batch))
                        batch, batched = [], 0
            finally:
                if pending is not None:  # the file is closed only after its last write
                    await asyncio.wait([pending])
            pending.result() if pending is not None else None
            write(b"".join(batch))
        if length is not None and size != length:
            raise BadRequest(f"{what} ended after {size} of {length} bytes; send it again")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return Received(path, size, digest.hexdigest())


def clear_tmp(tmp_dir: Path) -> None:
    """Remove what an earlier server left half-done: only the entries this package names in
    ``tmp/`` under its state dir (``upload-*`` files, ``package-*`` staging directories); anything
    else someone put there stays."""
    if not tmp_dir.is_dir():
        return
    for entry in tmp_dir.iterdir():
        if not entry.name.startswith(TMP_PREFIXES):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
