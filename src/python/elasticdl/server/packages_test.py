"""Package extraction on a Python without tarfile's extraction filters (before 3.11.4; the
server's image has Debian 12's 3.11.2) gives what the 'data' filter gives on a newer one."""

from __future__ import annotations

import asyncio
import gzip
import io
import stat
import tarfile

import pytest
from elasticdl.server.packages import PackageStore


def _package() -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        directory = tarfile.TarInfo("mnist")
        directory.type, directory.mode, directory.uid = tarfile.DIRTYPE, 0o777, 4242
        tar.addfile(directory)
        data = b"def custom_model():\n    return 1\n"
        model = tarfile.TarInfo("mnist/model.py")
        model.size, model.mode, model.uid, model.uname = len(data), 0o4777, 4242, "root"
        tar.addfile(model, io.BytesIO(data))
    return gzip.compress(raw.getvalue())


def _without_filters(monkeypatch) -> None:
    """tarfile as Python 3.11.2 has it: no data_filter, no ``filter`` argument."""
    monkeypatch.delattr(tarfile, "data_filter")
    extractall = tarfile.TarFile.extractall

    def old_extractall(self, path=".", members=None, *, numeric_owner=False, **kwargs):
        if kwargs:
            raise TypeError(
                f"extractall() got an unexpected keyword argument {next(iter(kwargs))!r}"
            )
        return extractall(self, path, members, numeric_owner=numeric_owner)

    monkeypatch.setattr(tarfile.TarFile, "extractall", old_extractall)


@pytest.mark.parametrize("filters", [True, False], ids=["data-filter", "python-3.11.2"])
def test_extracted_modes_and_owner(tmp_path, monkeypatch, filters):
    if not filters:
        _without_filters(monkeypatch)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python has no tarfile extraction filters")
    for d in ("tmp", "packages"):
        (tmp_path / d).mkdir()
    store = PackageStore(tmp_path / "packages", tmp_path / "tmp", 1 << 20, 1 << 20, 100)
    body = _package()

    async def chunks():
        yield body

    info, new = asyncio.run(store.add(chunks(), len(body), user="alice"))
    assert new and info.files == 1
    root = store.path(info.id, user="alice")
    model = root / "mnist" / "model.py"
    assert model.read_text().startswith("def custom_model")
    # No set-uid bit, no write for group and others; not the archive's owner (uid 4242).
    assert stat.S_IMODE(model.stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "mnist").stat().st_mode) == 0o755
    assert model.stat().st_uid != 4242
