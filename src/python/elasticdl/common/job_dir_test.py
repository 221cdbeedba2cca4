import os
import stat

import pytest
from elasticdl.common import job_dir
from elasticdl.common.job_dir import temp_files_of, write_atomically


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_file_holds_the_data_and_nothing_else_is_left(tmp_path):
    path = tmp_path / "status.json"
    path.write_text("old, and longer than the new text")
    write_atomically(path, "new")
    assert path.read_text() == "new"
    write_atomically(path, b"\x00bytes")
    assert path.read_bytes() == b"\x00bytes"
    assert sorted(os.listdir(tmp_path)) == ["status.json"]


def test_mode_is_set_whatever_the_umask_and_defaults_to_what_open_gives(tmp_path):
    old = os.umask(0o077)
    try:
        write_atomically(tmp_path / "builder.py", "x", mode=0o644)
        write_atomically(tmp_path / "secret", "x", mode=0o600)
        write_atomically(tmp_path / "plain", "x")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "builder.py") == 0o644
    assert _mode(tmp_path / "secret") == 0o600
    assert _mode(tmp_path / "plain") == 0o600  # 0666 less the umask 077


def test_a_symlink_at_the_path_is_replaced_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("must stay")
    link = tmp_path / "job" / "status.json"
    link.parent.mkdir()
    link.symlink_to(outside)
    write_atomically(link, "status")
    assert not link.is_symlink() and link.read_text() == "status"
    assert outside.read_text() == "must stay"


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary_one(tmp_path, monkeypatch):
    path = tmp_path / "job.json"
    path.write_text("old")

    def no_rename(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(OSError, match="No space"):
        write_atomically(path, "new")
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["job.json"]


def test_durable_writes_sync_the_file_and_its_directory(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_atomically(tmp_path / "a", "x")
    assert synced == []
    write_atomically(tmp_path / "b", "x", durable=True)
    assert synced == [False, True]


def test_leftovers_of_a_killed_writer_are_found(tmp_path):
    (tmp_path / ".status.json.0a1b2c.tmp").write_text("torn")
    (tmp_path / "status.json.tmp").write_text("an older writer's")
    (tmp_path / ".other.0a1b2c.tmp").write_text("another file's")
    found = sorted(p.name for p in temp_files_of(tmp_path, "status.json"))
    assert found == [".status.json.0a1b2c.tmp", "status.json.tmp"]
    assert temp_files_of(tmp_path, "missing") == []


def test_local_job_directories_live_under_elasticdl_home(monkeypatch, tmp_path):
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path / "home"))
    assert job_dir.jobs_root() == str(tmp_path / "home" / "jobs")
    assert job_dir.default_job_dir("mnist") == str(tmp_path / "home" / "jobs" / "mnist")
    assert job_dir.replica_log_name("worker", 3) == "worker-3.log"
    assert job_dir.replica_exit_name("ps", 0) == "ps-0.exit"
