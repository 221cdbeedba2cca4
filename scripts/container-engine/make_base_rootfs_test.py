"""make_base_rootfs's choice of packages, from a stand-in dpkg database: what is on disk
counts (a pending trigger included), what is missing fails, and the key follows the versions."""
from __future__ import annotations

import make_base_rootfs as mbr
import pytest

DB = {
    # package: (status, depends, version)
    "python3": ("install ok installed", "libc-bin, bash (>= 5)", "3.11.2-1"),
    "bash": ("install ok installed", "coreutils | busybox", "5.2.15-2"),
    "coreutils": ("install ok installed", "", "9.1-1"),
    # What an `apt-get install` beside the build leaves until libc-bin's ldconfig trigger runs.
    "libc-bin": ("install ok triggers-pending", "", "2.36-9"),
    "busybox": ("deinstall ok config-files", "", "1.35"),
}


@pytest.fixture
def dpkg(monkeypatch):
    db = {k: list(v) for k, v in DB.items()}

    def query(package, fmt):
        if package not in db:
            return None
        status, depends, version = db[package]
        return {"${Status}": status, "${Pre-Depends},${Depends}": "," + depends}.get(fmt, version)

    monkeypatch.setattr(mbr, "_dpkg_query", query)
    return db


def test_a_package_with_a_pending_trigger_is_on_disk_and_a_removed_one_is_not(dpkg):
    assert mbr.installed_closure(["python3"]) == {"python3", "bash", "coreutils", "libc-bin"}


def test_a_required_package_not_on_disk_fails_with_one_line(dpkg, capsys):
    dpkg["libc-bin"][0] = "install ok unpacked"
    assert mbr.main(["make_base_rootfs.py", "--key"]) == 1
    assert "the host lacks the Debian packages libc-bin" in capsys.readouterr().err


def test_the_key_follows_the_packages_versions(dpkg, capsys):
    assert mbr.main(["make_base_rootfs.py", "--key"]) == 0
    first = capsys.readouterr().out.strip()
    assert mbr.main(["make_base_rootfs.py", "--key"]) == 0
    assert capsys.readouterr().out.strip() == first
    dpkg["libc-bin"][2] = "2.36-10"
    assert mbr.main(["make_base_rootfs.py", "--key"]) == 0
    assert capsys.readouterr().out.strip() != first
