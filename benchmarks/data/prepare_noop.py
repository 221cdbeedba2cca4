"""`elasticdl dataset prepare fashion_mnist` on an output that is already complete (the no-op a
second run is), against hashing the raw input files -- the part of that check it cannot skip:
it compares the inputs' sha256 with the manifest's -- in one run.

    python benchmarks/data/prepare_noop.py        # [--limit N] [--repeats 9] [--output DIR]

The raw data comes as in the tests (Debian's dataset-fashion-mnist package, fetched into
~/.cache/elasticdl once). The output is prepared once first (``--limit``: only the first N
records per split, for a quick run), then rounds alternate the no-op prepare and the hash; the
table shows their medians and the ratio no-op / hash, with the load average before and after;
the last line is JSON. This was a test's "second run in < 2 s"; the test now asserts that the
second run converts and writes nothing.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile

_HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.dirname(_HERE), os.path.join(_HERE, "..", "..", "src", "python")):
    if os.path.abspath(_path) not in sys.path:
        sys.path.insert(0, os.path.abspath(_path))

from elasticdl.data.datasets import fashion_mnist, prepare  # noqa: E402
from interleaved import interleaved, load_average, print_summary, summary  # noqa: E402


def _sha256(paths) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--output", default=None, help="default: a temporary directory")
    args = p.parse_args(argv)
    load_before = load_average()
    inputs = fashion_mnist.locate(None).files
    with tempfile.TemporaryDirectory() as tmp:
        out = args.output or os.path.join(tmp, "fashion_mnist")
        first = prepare("fashion_mnist", out, progress=False, limit=args.limit)

        def noop():
            assert prepare("fashion_mnist", out, progress=False, limit=args.limit).skipped

        def hash_inputs():
            _sha256(inputs)

        seconds = interleaved({"no-op prepare": noop, "hash inputs": hash_inputs}, args.repeats)
    result = summary(
        "prepare_noop",
        seconds,
        ("no-op prepare", "hash inputs"),
        load_before,
        records=first.counts,
        input_bytes=sum(os.path.getsize(f) for f in inputs),
        first_prepare_s=first.seconds,
    )
    print_summary(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
