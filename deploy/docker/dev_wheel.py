#!/usr/bin/env python3
"""Pack the source tree's ``elasticdl`` package into a development wheel, without Pants.

The released wheels come from ``./pants package ::`` (dist/). This one is for building a base
image from a checkout before (or without) a Pants build: all of ``src/python/elasticdl``
except tests, including the generated protobuf modules (run scripts/gen-protos.sh first).
It declares no dependencies: the image build installs them separately (see
deploy/docker/README.md).

Usage: dev_wheel.py OUT_DIR [--src src/python] [--version 0.0.0.dev0]
Prints the wheel path.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import sys
import zipfile
from pathlib import Path

NAME = "elasticdl"
SKIP_SUFFIXES = ("_test.py", ".pyc")
SKIP_PARTS = {"__pycache__", "testdata"}


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def package_files(src_root: Path) -> list[Path]:
    pkg = src_root / NAME
    if not (pkg / "__init__.py").is_file():
        raise SystemExit(f"dev_wheel: {pkg} is not the elasticdl package (pass --src)")
    files = []
    for f in sorted(pkg.rglob("*")):
        rel = f.relative_to(src_root)
        if not f.is_file() or SKIP_PARTS & set(rel.parts) or f.name.endswith(SKIP_SUFFIXES) or f.name == "BUILD":
            continue
        files.append(f)
    if not (pkg / "proto" / "elasticdl_pb2.py").is_file():
        print("dev_wheel: warning: elasticdl/proto/elasticdl_pb2.py missing; run scripts/gen-protos.sh", file=sys.stderr)
    return files


def build(out_dir: Path, src_root: Path, version: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{NAME}-{version}-py3-none-any.whl"
    dist_info = f"{NAME}-{version}.dist-info"
    records = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:

        def add(arcname: str, data: bytes) -> None:
            # Fixed timestamps: the same tree gives the same wheel (and a cached image layer).
            info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
            records.append(_record_line(arcname, data))

        for f in package_files(src_root):
            add(f.relative_to(src_root).as_posix(), f.read_bytes())
        add(
            f"{dist_info}/METADATA",
            f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {version}\n"
            "Summary: ElasticDL framework (development build from a source tree)\n"
            "Requires-Python: >=3.11\n".encode(),
        )
        add(
            f"{dist_info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: elasticdl-dev-wheel\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        record = "\n".join(records + [f"{dist_info}/RECORD,,"]) + "\n"
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        zf.writestr(info, record)
    return wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[2] / "src" / "python")
    parser.add_argument("--version", default="0.0.0.dev0")
    args = parser.parse_args(argv)
    print(build(args.out_dir, args.src, args.version))
    return 0


if __name__ == "__main__":
    sys.exit(main())
