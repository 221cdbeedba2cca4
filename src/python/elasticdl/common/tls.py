"""Mutual TLS between a job's replicas, with certificates the user gives (optional).

Why: the job secret (elasticdl.common.auth) proves membership, but without TLS it and the
model travel in clear on the pod network. With `--tls_cert_file`, `--tls_key_file` and
`--tls_ca_file` every gRPC server of the job (master, PS) serves TLS and requires a client
certificate signed by that CA, and every channel (worker -> master, worker -> PS,
PS -> master) presents the same certificate and checks the server's against the CA. The job
secret is still checked on every call: a certificate admits a connection, the secret a job.

All replicas use one certificate, so it must name every address they dial: the hosts of the
master and PS addresses (127.0.0.1 for local jobs, the Service names on Kubernetes), or one
name given as `--tls_server_name` that channels expect instead of the address's host.
On Kubernetes the paths are those inside the pods (the client checks only that all three are
given): put the files in a Secret and mount it with
`--volume=secret_name=<secret>,mount_path=/etc/elasticdl-tls` (files 0440, group of the pods).

The files are read by whoever checks the spec, the job server among them, so a path is only
ever read as a small regular file: a FIFO, a device (/dev/zero) or a directory is refused
without a read, a file over ``MAX_PEM_BYTES`` after reading that much, and a path that is
missing reads the same as one that cannot be opened (the message does not tell whether a file
exists).
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Optional

import grpc

FLAGS = ("tls_cert_file", "tls_key_file", "tls_ca_file")
# A certificate chain or key is a few KiB; a CA bundle of every public root is ~200 KiB.
MAX_PEM_BYTES = 1 << 20


class TLSError(ValueError):
    """The TLS files are incomplete or unreadable; the message names the flag and the fix."""


def check_flags(cert_file: str, key_file: str, ca_file: str, server_name: str = "") -> bool:
    """Whether TLS is on: all three files or none (``--tls_server_name`` needs them)."""
    given = [f for f, v in zip(FLAGS, (cert_file, key_file, ca_file)) if v]
    if given and len(given) < len(FLAGS):
        missing = ", ".join(f"--{f}" for f in FLAGS if f not in given)
        raise TLSError(
            f"--{given[0]} needs {missing} too: mutual TLS takes this job's certificate, its "
            "private key and the CA that signed it"
        )
    if server_name and not given:
        raise TLSError("--tls_server_name applies only with --tls_cert_file, --tls_key_file, ...")
    return bool(given)


def _read(flag: str, path: str) -> bytes:
    unreadable = TLSError(
        f"--{flag} {path!r}: no readable regular file there (missing, not readable, or a "
        "directory, FIFO or device); give the path of the PEM file"
    )
    # O_NONBLOCK: opening a FIFO does not wait for a writer (regular files ignore the flag).
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(os.path.expanduser(path), flags)
    except OSError:
        raise unreadable from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise unreadable
        data = bytearray()
        while len(data) <= MAX_PEM_BYTES and (chunk := os.read(fd, 1 << 16)):
            data += chunk
    except OSError:
        raise unreadable from None
    finally:
        os.close(fd)
    if len(data) > MAX_PEM_BYTES:
        raise TLSError(
            f"--{flag} {path!r} is over {MAX_PEM_BYTES >> 20} MiB; a PEM certificate, key or "
            "CA is a few KiB"
        )
    if b"-----BEGIN " not in data:
        raise TLSError(f"--{flag} {path!r} is not a PEM file; give the PEM-encoded file")
    return bytes(data)


@dataclass(frozen=True)
class TLS:
    """The PEM bytes of the job's certificate, key and CA, read once per process."""

    cert: bytes
    key: bytes
    ca: bytes
    server_name: str = ""

    @classmethod
    def from_files(
        cls, cert_file: str, key_file: str, ca_file: str, server_name: str = ""
    ) -> Optional["TLS"]:
        """None when no file is given (TLS off); TLSError for a partial or unreadable set."""
        if not check_flags(cert_file, key_file, ca_file, server_name):
            return None
        return cls(
            _read("tls_cert_file", cert_file),
            _read("tls_key_file", key_file),
            _read("tls_ca_file", ca_file),
            server_name,
        )

    @classmethod
    def of(cls, spec) -> Optional["TLS"]:
        """From a job, PS or worker spec's ``tls_*`` fields."""
        return cls.from_files(
            spec.tls_cert_file, spec.tls_key_file, spec.tls_ca_file, spec.tls_server_name
        )

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )

    def channel_options(self) -> list:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def channel(addr: str, options: list, tls: Optional[TLS]) -> grpc.Channel:
    """A channel to one of the job's servers: TLS with the job's certificate, or plain."""
    if tls is None:
        return grpc.insecure_channel(addr, options=options)
    return grpc.secure_channel(
        addr, tls.channel_credentials(), options=options + tls.channel_options()
    )


def add_port(server, address: str, tls: Optional[TLS]) -> int:
    """Bind ``server`` (a ``grpc.Server`` or the master's asyncio wrapper) to ``address``."""
    if tls is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, tls.server_credentials())
