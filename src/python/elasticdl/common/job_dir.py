"""A job directory, file by file, and the one way files are replaced in it (and elsewhere).

A local job's directory is ``~/.elasticdl/jobs/<job>/`` (``$ELASTICDL_HOME/jobs/<job>``) or the
``--job_dir`` given; a Kubernetes master with a ``--job_dir`` on a volume keeps its journal
and secret there too. Who writes what:

==========================  ==============  ===================================================
name                        written by      holds
==========================  ==============  ===================================================
``.elasticdl-job``          client          marker: ElasticDL uses (and maybe created) the dir
``job.json``                client          how the job was started (owner pid, platform, ...)
``job_spec.json``           client          the resolved spec the master reads (0600)
``cancelled``               client          ``elasticdl cancel`` was asked: no master restart
``exit_code``               job owner       the master's last exit status (the supervisor)
``status.json``             master          :class:`~elasticdl.common.job_status.JobStatus`
``job_secret``              master          the job's secret (0600), kept for a restart
``journal/``                master          state transitions (``elasticdl.master.journal``)
``logs/master.log``         job owner       the master's output
``logs/<kind>-<id>.log``    local platform  a replica's output (``worker-0.log``, ``ps-1.log``)
``logs/<kind>-<id>.exit``   replica         its exit status (``elasticdl.common.parent_watch``)
``recovery-checkpoints/``   PS              checkpoints of a job without ``--checkpoint_dir``
``checkpoint_dir/``         PS              ``--checkpoint_steps`` without ``--checkpoint_dir``
==========================  ==============  ===================================================

Every file a reader may look at while it changes (``status.json``, the journal's snapshots,
checkpoints, ``job.json``...) is replaced with :func:`write_atomically`.
Standard library only: the light client imports this.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

ELASTICDL_HOME_ENV = "ELASTICDL_HOME"

MARKER_FILE = ".elasticdl-job"
JOB_FILE = "job.json"
JOB_SPEC_FILE = "job_spec.json"
CANCELLED_FILE = "cancelled"
EXIT_CODE_FILE = "exit_code"
STATUS_FILE = "status.json"
SECRET_FILE = "job_secret"
JOURNAL_DIR = "journal"
LOG_DIR = "logs"
MASTER_LOG = "master.log"
RECOVERY_DIR = "recovery-checkpoints"
CHECKPOINT_SUBDIR = "checkpoint_dir"


def elasticdl_home() -> str:
    """``$ELASTICDL_HOME`` or ``~/.elasticdl``: config file and local job directories."""
    home = os.environ.get(ELASTICDL_HOME_ENV) or "~/.elasticdl"
    return os.path.abspath(os.path.expanduser(home))


def jobs_root() -> str:
    """Directory holding one sub-directory per local job."""
    return os.path.join(elasticdl_home(), "jobs")


def default_job_dir(job_name: str) -> str:
    return os.path.join(jobs_root(), job_name)


def replica_log_name(kind: str, replica_id: int) -> str:
    """``logs/``'s file of a replica's output: ``worker-0.log``."""
    return f"{kind}-{replica_id}.log"


def replica_exit_name(kind: str, replica_id: int) -> str:
    """``logs/``'s file of a replica's exit status: ``worker-0.exit``."""
    return f"{kind}-{replica_id}.exit"


# --------------------------------------------------------------------------------------------
# Replacing a file
# --------------------------------------------------------------------------------------------

_TEMP_SUFFIX = ".tmp"


def write_atomically(
    path: str | os.PathLike, data: str | bytes, *, mode: int | None = None, durable: bool = False
) -> None:
    """Replace ``path`` by a file holding ``data``: a reader sees the old file or the new one,
    never part of either, and a crash leaves one of them.

    The data goes to a temporary file in the same directory (``.<name>.<random>.tmp``: hidden,
    so data readers that skip dot files skip it), created with ``O_EXCL | O_NOFOLLOW``, so a
    symlink planted at that name is never followed; then it is renamed over ``path``, which
    replaces a symlink at ``path`` rather than writing where it points.

    ``mode``: the file's permissions, set before any data is written (``None``: what ``open``
    gives, 0666 less the umask). ``durable``: the data and the rename survive a machine crash
    (fsync of the file before the rename, of the directory after it) - for files a restarted
    process relies on. On any error the temporary file is removed and the error raised.
    """
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}{_TEMP_SUFFIX}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o666 if mode is None else mode)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)  # the umask may have narrowed it
            view = memoryview(data.encode() if isinstance(data, str) else data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_directory(target.parent)


def fsync_directory(directory: str | os.PathLike) -> None:
    """Make the directory's entries (a rename, a new file) survive a machine crash."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_files_of(directory: str | os.PathLike, name: str) -> list[Path]:
    """What :func:`write_atomically` of ``directory/name`` left behind when its process was
    killed mid-write (older writers used ``<name>.tmp``)."""
    root = Path(directory)
    found = list(root.glob(f".{_glob_escape(name)}.*{_TEMP_SUFFIX}"))
    legacy = root / f"{name}{_TEMP_SUFFIX}"
    return found + [legacy] if legacy.is_file() or legacy.is_symlink() else found


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)
