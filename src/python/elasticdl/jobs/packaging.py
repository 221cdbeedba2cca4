"""A model-zoo directory as a tarball for the job server (``POST /v1/packages``).

The tarball is reproducible: members sorted, owners, times and modes normalised, and gzip
without a time stamp, so the same directory always gives the same bytes, hence the same
package id (the server's sha256) and no second upload. Caches and VCS directories are left
out; symbolic links are packed as the files they point to (the server accepts no links).
"""

from __future__ import annotations

import gzip
import os
import tarfile
import tempfile
from pathlib import Path
from typing import BinaryIO

from elasticdl.jobs.errors import ClientError

SKIP_DIRS = {
    "__pycache__",
    ".git",
    ".hg",
    ".svn",
    ".mypy_cache",
    ".pytest_cache",
    ".ipynb_checkpoints",
}
SKIP_SUFFIXES = (".pyc", ".pyo")


def _files(root: Path) -> list[Path]:
    found = []
    for directory, dirs, files in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            if not name.endswith(SKIP_SUFFIXES):
                found.append(Path(directory) / name)
    return found


def package_tarball(directory: str | os.PathLike) -> BinaryIO:
    """A temporary file (rewound) holding the gzip tarball of ``directory``'s contents."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise ClientError(
            f"--package_path {str(directory)!r} is not a directory; point it at your model zoo"
        )
    files = _files(root)
    if not files:
        raise ClientError(f"--package_path {str(directory)!r} holds no files")
    out = tempfile.TemporaryFile()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=6) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in files:
                if not path.is_file():
                    continue  # a dangling link, a socket, ...
                info = tarfile.TarInfo(path.relative_to(root).as_posix())
                st = path.stat()
                info.size = st.st_size
                info.mode = 0o755 if st.st_mode & 0o111 else 0o644
                with open(path, "rb") as f:
                    tar.addfile(info, f)
    out.seek(0)
    return out
