#!/usr/bin/env python3
"""Write a rootfs tarball (importable with `docker import`) made of the host's installed
Debian packages: python3 (+ pip when the host has python3-pip), a shell, coreutils and the
closure of their Depends, plus the host's CA bundle.

Why: the build machines reach no container registry, so there is no `python:3.11` to pull.
The host is Debian 12 like the image would be, so its packages run unchanged in a container.
No network, about 2 s.

Usage: make_base_rootfs.py OUT.tar
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile

ROOT_PACKAGES = [
    "base-files", "bash", "dash", "coreutils", "libc-bin", "grep", "sed", "findutils",
    "gzip", "tar", "ca-certificates", "python3", "python3.11", "python3-pip", "python3-venv",
    # C++ runtime + OpenMP: the native kernels (elasticdl_native) link them.
    "libstdc++6", "libgomp1",
]
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
        status = _dpkg_query(pkg, "${Status}")
        if not status or "install ok installed" not in status:
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


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: make_base_rootfs.py OUT.tar", file=sys.stderr)
        return 2
    packages = installed_closure(ROOT_PACKAGES)
    if "python3" not in packages:
        print("make_base_rootfs: the host has no python3 Debian package", file=sys.stderr)
        return 1
    paths = package_paths(packages)
    write_tar(argv[1], paths)
    print(f"make_base_rootfs: {len(packages)} packages, {len(paths)} paths -> {argv[1]}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
