"""The wheels' digest changes with what a wheel holds, and only with that."""
from __future__ import annotations

import zipfile

from wheels_digest import main, wheels_digest


def _wheel(path, files, date=(2026, 1, 1, 0, 0, 0)):
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=date), data)


def test_the_digest_follows_the_contents_not_the_timestamps(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    files = {"elasticdl/worker/x.py": b"one", "elasticdl-1.dist-info/RECORD": b"r"}
    _wheel(a / "elasticdl-1-py3-none-any.whl", files)
    _wheel(
        b / "elasticdl-1-py3-none-any.whl",
        dict(reversed(list(files.items()))),
        (2026, 5, 5, 1, 2, 4),
    )
    assert wheels_digest(str(a)) == wheels_digest(str(b))  # order and dates of members: same

    _wheel(b / "elasticdl-1-py3-none-any.whl", {**files, "elasticdl/worker/x.py": b"two"})
    assert wheels_digest(str(a)) != wheels_digest(str(b))  # a changed file
    _wheel(b / "elasticdl-1-py3-none-any.whl", files)
    _wheel(b / "elasticdl_native-1-cp311.whl", {"n.so": b"\0"})
    assert wheels_digest(str(a)) != wheels_digest(str(b))  # one more wheel

    assert main(["wheels_digest.py", str(a)]) == 0
    assert capsys.readouterr().out.strip() == wheels_digest(str(a))
    assert main(["wheels_digest.py", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
