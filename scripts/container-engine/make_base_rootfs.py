#!/usr/bin/env python3
"""Write a rootfs tarball (importable with `docker import`) made of the host's installed
Debian packages: python3 (+ pip when the host has python3-pip), a shell, coreutils and the
closure of their Depends, plus the host's CA bundle.

Why: the build machines reach no container registry, so there is no `python:3.11` to pull.
The host is Debian 12 like the image would be, so its packages run unchanged in a container.
No network, about 2 s.

A package counts when its files are on disk: installed, or installed with a trigger pending
(an `apt-get install` running beside this leaves libc-bin "triggers-pending" until its
ldconfig trigger runs; skipping it left images without `ldd`). The packages the image cannot
work without must be in the closure, or this fails.

`--key` prints what the rootfs is made of instead (a digest of every package's name and
version, and of this script): the engine scripts label the imported image with it and import
it again when the host's packages, or this script, change.

Usage: make_base_rootfs.py OUT.tar | make_base_rootfs.py --key
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile

ROOT_PACKAGES = [
    "base-files",
    "bash",
    "dash",
    "coreutils",
    "libc-bin",
    "grep",
    "sed",
    "findutils",
    "gzip",
    "tar",
    "ca-certificates",
    "python3",
    "python3.11",
    "python3-pip",
    "python3-venv",
    # C++ runtime + OpenMP: the native kernels (elasticdl_native) link them.
    "libstdc++6",
    "libgomp1",
]
# Without these the image is not one: a shell, the dynamic loader's tools, python3.
REQUIRED_PACKAGES = ["bash", "coreutils", "libc-bin", "python3"]
# dpkg states in which a package's files are all on disk.
ON_DISK = ("installed", "triggers-pending", "triggers-awaited")
# Generated files (not owned by any package) that a working system needs.
EXTRA_FILES = [
    "/etc/ssl/certs/ca-certificates.crt",  # includes any local CA that re-signs TLS
    "/etc/ld.so.cache",
    "/etc/nsswitch.conf",
    "/etc/hosts",
]
SKELETON_DIRS = ["tmp", "var/tmp", "root", "proc", "sys", "dev", "run", "etc", "home"]
SMALL_FILES = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/bash\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "etc/group": "root:x:0:\nnogroup:x:65534:\n",
}


def _dpkg_query(package: str, fmt: str) -> str | None:
    r = subprocess.run(["dpkg-query", "-W", "-f", fmt, package], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def installed_closure(roots: list[str]) -> set[str]:
    """Installed packages reachable from roots through Pre-Depends/Depends (first
    alternative of each), skipping what the host does not have."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        pkg = todo.pop()
        if pkg in seen:
            continue
        status = (_dpkg_query(pkg, "${Status}") or "").split()
        if len(status) != 3 or status[1] != "ok" or status[2] not in ON_DISK:
            continue
        seen.add(pkg)
        for alternatives in (_dpkg_query(pkg, "${Pre-Depends},${Depends}") or "").split(","):
            dep = alternatives.split("|")[0].split("(")[0].strip().split(":")[0]
            if dep:
                todo.append(dep)
    return seen


def package_paths(packages: set[str]) -> set[str]:
    paths: set[str] = set()
    for pkg in packages:
        listing = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True).stdout
        for f in listing.splitlines():
            if not f.startswith("/") or f == "/.":
                continue
            # Resolve usrmerge directory links (/bin/x -> /usr/bin/x) so each file is
            # stored once, at its real place; the top-level links are added separately.
            real = os.path.join(os.path.realpath(os.path.dirname(f)), os.path.basename(f))
            if os.path.lexists(real):
                paths.add(real)
    paths.update(p for p in EXTRA_FILES if os.path.exists(p))
    return paths


def write_tar(out: str, paths: set[str]) -> None:
    with tarfile.open(out, "w") as tar:
        for top in ("bin", "sbin", "lib", "lib64"):
            if os.path.islink("/" + top):
                ti = tarfile.TarInfo(top)
                ti.type = tarfile.SYMTYPE
                ti.linkname = os.readlink("/" + top)
                tar.addfile(ti)
        names = {p.lstrip("/") for p in paths}
        for d in SKELETON_DIRS:
            if d not in names:
                ti = tarfile.TarInfo(d)
                ti.type = tarfile.DIRTYPE
                ti.mode = 0o1777 if "tmp" in d else 0o755
                tar.addfile(ti)
        for p in sorted(paths):
            name = p.lstrip("/")
            if name in SMALL_FILES or name in ("bin", "sbin", "lib", "lib64"):
                continue
            tar.add(p, arcname=name, recursive=False)
        for name, text in SMALL_FILES.items():
            data = text.encode()
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            ti.mode = 0o644
            tar.addfile(ti, io.BytesIO(data))


def rootfs_key(packages: set[str]) -> str:
    """A digest of the packages (name and version) and of this script."""
    h = hashlib.sha256()
    with open(__file__, "rb") as f:
        h.update(f.read())
    for pkg in sorted(packages):
        h.update(f"{pkg} {_dpkg_query(pkg, '${Version}') or ''}\n".encode())
    return h.hexdigest()[:24]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: make_base_rootfs.py OUT.tar | make_base_rootfs.py --key", file=sys.stderr)
        return 2
    packages = installed_closure(ROOT_PACKAGES)
    missing = [p for p in REQUIRED_PACKAGES if p not in packages]
    if missing:
        print(
            f"make_base_rootfs: the host lacks the Debian packages {', '.join(missing)} "
            "(installed, with files on disk): install them, then run this again",
            file=sys.stderr,
        )
        return 1
    if argv[1] == "--key":
        print(rootfs_key(packages))
        return 0
    paths = package_paths(packages)
    write_tar(argv[1], paths)
    print(
        f"make_base_rootfs: {len(packages)} packages, {len(paths)} paths -> {argv[1]}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
