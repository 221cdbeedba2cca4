"""RecordIO scan speed: every record of a file of small records, against a Python loop over the
same records already in memory (the floor any reader pays per record), in one run.

    python benchmarks/data/recordio_scan.py       # [--records 200000] [--repeats 9]

The file: ``--records`` records of 32 bytes, snappy, 1 MiB chunks (what the data tests
write). Rounds alternate scan and baseline; the table shows their medians, records/s and the
ratio scan / in-memory loop (the figure to compare across machines and commits), with the load
average before and after; the last line is JSON. This was a test's "200k records in < 2 s";
the test now asserts what made it fast (one read per chunk, none per record).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

_HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.dirname(_HERE), os.path.join(_HERE, "..", "..", "src", "python")):
    if os.path.abspath(_path) not in sys.path:
        sys.path.insert(0, os.path.abspath(_path))

from elasticdl.data.recordio import Scanner, Writer  # noqa: E402
from interleaved import interleaved, load_average, print_summary, summary  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args(argv)
    load_before = load_average()
    records = [b"%08d" % i * 4 for i in range(args.records)]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "scan.rio")
        with Writer(path, compressor="snappy", max_chunk_size=1 << 20) as w:
            for r in records:
                w.write(r)

        def scan():
            assert sum(1 for _ in Scanner(path)) == args.records

        def in_memory():
            assert sum(1 for _ in iter(records)) == args.records

        seconds = interleaved({"scan": scan, "in-memory loop": in_memory}, args.repeats)
        file_bytes = os.path.getsize(path)
    result = summary(
        "recordio_scan",
        seconds,
        ("scan", "in-memory loop"),
        load_before,
        records=args.records,
        file_bytes=file_bytes,
    )
    print_summary(result, per=(args.records, "records"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
