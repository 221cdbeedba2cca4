"""Reading the job's TLS files (``tls._read``): only small regular files, and one message for
a path that is missing and one that cannot be read.

Each read runs in a child process with a 2 GiB address-space limit and a timeout, so a reader
that followed /dev/zero or waited on a FIFO fails the test instead of taking the machine or
the test run with it. "Not readable" needs a user that permissions stop: as root (here and in
CI) the child drops to nobody (65534) after its imports.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import elasticdl
import pytest
from elasticdl.common import tls  # noqa: F401  (what the child process reads with)

SRC = str(Path(elasticdl.__file__).resolve().parent.parent)
CHILD = """
import os, resource, sys
from elasticdl.common import tls
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
paths = sys.argv[1:]
if paths[0] == "--as-nobody":
    paths = paths[1:]
    if os.getuid() == 0:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
for path in paths:
    try:
        tls._read("tls_cert_file", path)
        print("read")
    except tls.TLSError as e:
        print(e)
"""
PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
NO_FILE = "no readable regular file there (missing, not readable, or a directory, FIFO or device)"


def read(*paths: str, as_nobody: bool = False) -> list[str]:
    """What ``_read`` says of each path, one line each, read by a child process."""
    argv = [sys.executable, "-c", CHILD, *(["--as-nobody"] if as_nobody else []), *paths]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.splitlines()


@pytest.fixture
def shared_dir():
    """A directory nobody may traverse (tmp_path's parents are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="tls-test-", dir="/tmp"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path)


def test_a_pem_file_is_read(tmp_path):
    (tmp_path / "job.pem").write_bytes(PEM)
    assert read(str(tmp_path / "job.pem")) == ["read"]


def test_fifos_devices_and_directories_are_refused_without_a_read(tmp_path):
    os.mkfifo(tmp_path / "fifo")  # no writer ever comes: opening it to read would wait forever
    (tmp_path / "zero").symlink_to("/dev/zero")
    paths = ["/dev/zero", str(tmp_path / "fifo"), str(tmp_path / "zero"), str(tmp_path)]
    for path, said in zip(paths, read(*paths)):
        assert said == f"--tls_cert_file {path!r}: {NO_FILE}; give the path of the PEM file"


def test_a_missing_file_and_an_unreadable_one_read_the_same(shared_dir):
    secret = shared_dir / "secret.pem"
    secret.write_bytes(PEM)
    secret.chmod(0o000)
    missing, unreadable = read(
        str(shared_dir / "none.pem"), str(shared_dir / "secret.pem"), as_nobody=True
    )
    assert missing.replace("none.pem", "X") == unreadable.replace("secret.pem", "X")
    assert NO_FILE in missing


def test_a_file_over_the_cap_is_refused(tmp_path):
    big = tmp_path / "big.pem"
    big.write_bytes(PEM + b"#" * (1 << 20))
    (said,) = read(str(big))
    assert said.endswith("is over 1 MiB; a PEM certificate, key or CA is a few KiB"), said
