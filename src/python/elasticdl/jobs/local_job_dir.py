"""The directory of a local job (default ``~/.elasticdl/jobs/<job_name>``), and what may be
removed from it.

    job.json        written by the client at submit: name, platform, master command, pid, times
    job_spec.json   the resolved job spec the master runs (``JobSpec.to_json``)
    status.json     written by the master while it runs (see ``job_status.JobStatus``)
    exit_code       the master's exit status, written by the job's owner when it ends
    cancelled       present once ``cancel`` was requested (time stamp inside)
    logs/master.log master stdout+stderr; logs/ps-0.log, logs/worker-0.log ... by the platform
    recovery-checkpoints/  the master's checkpoints for relaunched PS (when it has none given)
    journal/        the master's journal, from which a restarted master resumes the job
    job_secret      the job's secret (0600), written by the master
    .elasticdl-job  the marker: this directory holds a job the client submitted

Re-submitting a job of the same name replaces the previous job's files, and only those: the
entries above, in a directory that carries the marker. A directory without it (say a
``--job_dir`` that merely contains a ``job.json``) is never deleted; the client refuses it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from elasticdl.common.job_dir import (  # noqa: F401 (the job directory's names, re-exported)
    CANCELLED_FILE,
    EXIT_CODE_FILE,
    JOB_FILE,
    JOB_SPEC_FILE,
    JOURNAL_DIR,
    LOG_DIR,
    MARKER_FILE,
    MASTER_LOG,
    RECOVERY_DIR,
    SECRET_FILE,
    STATUS_FILE,
    temp_files_of,
    write_atomically,
)
from elasticdl.common.types import PlatformName
from elasticdl.jobs.errors import ClientError

# What the client, the master and the local platform write into a job directory.
OWN_FILES = (JOB_FILE, JOB_SPEC_FILE, STATUS_FILE, EXIT_CODE_FILE, CANCELLED_FILE, SECRET_FILE)
OWN_DIRS = (LOG_DIR, RECOVERY_DIR, JOURNAL_DIR)


def write_text_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    write_atomically(path, text, mode=mode)


def write_json_atomic(path: Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True))


def read_json(path: Path) -> dict | None:
    # status.json is replaced atomically by the master, but tolerate a writer that does not.
    for _ in range(3):
        try:
            data = json.loads(path.read_text())
            return data if isinstance(data, dict) else None
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except (json.JSONDecodeError, UnicodeDecodeError):
            time.sleep(0.05)
    return None


def is_job_directory(directory: Path) -> bool:
    """Whether ``directory`` carries the marker the client writes into the job directories
    it creates."""
    return (directory / MARKER_FILE).is_file() and not (directory / MARKER_FILE).is_symlink()


def mark_job_directory(directory: Path, job_name: str, created: bool) -> None:
    (directory / MARKER_FILE).write_text(
        json.dumps({"job_name": job_name, "created_dir": created}) + "\n"
    )


def clear_job_directory(directory: Path, what: str, legacy_name: str = "") -> bool:
    """Remove the previous job's files from ``directory`` (only what ElasticDL writes there),
    then the directory itself if ElasticDL created it and nothing else is left. Returns
    whether it is gone. Raises ClientError for a directory ElasticDL did not create.

    ``legacy_name``: the directory is the default one of that job under the jobs root; one
    written before the marker existed (its job.json names that job) counts as created."""
    if not directory.exists() and not directory.is_symlink():
        return True
    if not directory.is_dir() or directory.is_symlink():
        raise ClientError(f"{what} {directory} is not a directory; remove it or choose another")
    if not any(directory.iterdir()):
        return False  # empty: use it as it is
    if legacy_name and not is_job_directory(directory):
        old = read_json(directory / JOB_FILE) or {}
        if old.get("job_name") == legacy_name and old.get("platform") == PlatformName.LOCAL:
            (directory / MARKER_FILE).write_text(json.dumps({"created_dir": True}) + "\n")
    if not is_job_directory(directory):
        raise ClientError(
            f"{what} {directory} exists and was not created by ElasticDL; "
            "use a new or empty directory, or remove it yourself"
        )
    for name in OWN_FILES:
        for path in [directory / name, *temp_files_of(directory, name)]:
            if path.is_file() or path.is_symlink():
                path.unlink()
    for name in OWN_DIRS:
        path = directory / name
        if path.is_symlink():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
    marker = read_json(directory / MARKER_FILE) or {}
    (directory / MARKER_FILE).unlink()
    if not marker.get("created_dir"):
        return False  # the user's directory: it stays
    try:
        directory.rmdir()
    except OSError:
        return False  # the user's own files stay, and so does the directory
    return True


def last_line(path: Path, limit: int = 200) -> str:
    """The last non-empty line of a log file (its last 4 KiB), at most ``limit`` characters."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = [
                line.strip()
                for line in f.read().decode("utf-8", "replace").splitlines()
                if line.strip()
            ]
    except OSError:
        return ""
    return lines[-1][:limit] if lines else ""
