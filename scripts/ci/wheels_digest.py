"""A digest of the project's wheels by what they hold, for Pants' test cache.

The image and real-node tests install the wheels of `./pants package` from $ELASTICDL_WHEEL_DIR,
which Pants does not see as an input: with only the directory's path in their environment, a
warm machine would serve their results from Pants' cache after the wheels changed. run-tests.sh
exports this digest as ELASTICDL_WHEELS_DIGEST, an environment variable those tests name, so
that their cache key changes with the wheels. It covers each wheel's member names and bytes,
not the zip's timestamps, so rebuilding the same sources keeps the cache.

    python3 scripts/ci/wheels_digest.py DIR     # prints the hex digest
"""
from __future__ import annotations

import hashlib
import sys
import zipfile
from pathlib import Path


def wheels_digest(directory: str) -> str:
    digest = hashlib.sha256()
    for wheel in sorted(Path(directory).glob("*.whl")):
        digest.update(wheel.name.encode() + b"\0")
        with zipfile.ZipFile(wheel) as archive:
            for name in sorted(archive.namelist()):
                digest.update(name.encode() + b"\0")
                digest.update(hashlib.sha256(archive.read(name)).digest())
    return digest.hexdigest()


def main(argv: list) -> int:
    if len(argv) != 2:
        print("usage: wheels_digest.py DIR", file=sys.stderr)
        return 2
    if not Path(argv[1]).is_dir():
        print(f"wheels_digest.py: {argv[1]} is not a directory", file=sys.stderr)
        return 2
    print(wheels_digest(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
