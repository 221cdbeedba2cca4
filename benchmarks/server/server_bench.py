"""The job server's request latency and upload throughput, one command:

    PYTHONPATH=src/python .venv/bin/python benchmarks/server/server_bench.py

1. ``--jobs`` jobs are submitted through a real server process (uvicorn on 127.0.0.1) and the
   real submit path (package, data paths, LocalBackend); their master is the client tests'
   FAKE master (``jobs/testdata/fake_master.py``: ends in ~0.1 s), because 100 TensorFlow
   masters do not fit this machine and list/status cost does not depend on what the master
   did. Then ``list_jobs`` and ``get_job_status`` through the SDK (a new connection per call,
   as the CLI makes them), against ``version`` (authentication + HTTP, no job work) and the
   backend's own ``list_jobs`` in-process, measured in the same run.
2. A ``--upload_mb`` file is uploaded through the SDK (client sha256 pass, streaming PUT,
   server-side hash, temp file + rename) and copied with ``cp`` to the same filesystem.

Prints medians and p99 (latency) and medians (throughput) with their ratios, then one JSON
line of the same figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from elasticdl.jobs.local_backend import LocalBackend
from elasticdl.jobs.server_client import JobServerClient
from elasticdl_testing.server_process import ServerProcess

FAKE_MASTER = (
    Path(__file__).resolve().parents[2] / "src/python/elasticdl/jobs/testdata/fake_master.py"
)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def latency(client: JobServerClient, state: Path, jobs: int, requests: int) -> dict:
    zoo = state.parent / "zoo"
    (zoo / "mnist").mkdir(parents=True)
    (zoo / "mnist" / "model.py").write_text("def custom_model():\n    pass\n")
    package = client.upload_package(zoo)
    (state.parent / "d").write_bytes(b"x")
    client.upload(state.parent / "d", "d/x")
    names = [f"bench-{i:03d}" for i in range(jobs)]
    for name in names:
        spec = {"job_name": name, "model_def": "mnist.model.custom_model", "training_data": "d"}
        client.submit_job(spec, package_id=package)
    deadline = time.monotonic() + 300
    while not all(j.is_final for j in client.list_jobs()):
        if time.monotonic() > deadline:
            raise SystemExit("the fake jobs did not end in 300 s")
        time.sleep(0.5)
    listed = client.list_jobs()
    assert len(listed) == jobs and all(j.phase == "Succeeded" for j in listed), listed[:3]
    backend = LocalBackend(root=state / "jobs" / "alice")
    results = {
        "version": timed(client.version, requests),
        "list": timed(client.list_jobs, requests),
        "status": timed(lambda: client.get_job_status(names[len(names) // 2]), requests),
        "list in-process": timed(backend.list_jobs, requests),
    }
    return results


def throughput(client: JobServerClient, work: Path, size_mb: int, repeats: int) -> dict:
    src = work / "upload.bin"
    with open(src, "wb") as f:
        for _ in range(size_mb):
            f.write(os.urandom(1 << 20))
    size = src.stat().st_size
    cp, up = [], []
    for _ in range(repeats):
        dst = work / "copy.bin"
        start = time.perf_counter()
        subprocess.run(["cp", str(src), str(dst)], check=True)
        cp.append(size / (time.perf_counter() - start) / 2**20)
        dst.unlink()
        start = time.perf_counter()
        client.upload(src, "bench/upload.bin")
        up.append(size / (time.perf_counter() - start) / 2**20)
    return {"cp": cp, "upload": up}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--upload_mb", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="server-bench-"))
    env = dict(os.environ, ELASTICDL_MASTER_PEX=str(FAKE_MASTER), FAKE_MASTER_STEPS="1")
    server = ServerProcess(work / "state", env)
    token = server.add_user("alice")
    server.start()
    try:
        client = JobServerClient(server.url, token)
        lat = latency(client, work / "state", args.jobs, args.requests)
        floor = statistics.median(lat["version"])
        print(
            f"latency with {args.jobs} jobs, {args.requests} requests each (SDK, new connection per call):"
        )
        for name, values in lat.items():
            median = statistics.median(values)
            print(
                f"  {name:16s} median {median * 1e3:7.2f} ms  p99 {percentile(values, 0.99) * 1e3:7.2f} ms"
                f"  ({median / floor:5.2f}x version)"
            )
        thr = throughput(client, work, args.upload_mb, args.repeats)
        cp, up = statistics.median(thr["cp"]), statistics.median(thr["upload"])
        print(f"upload of {args.upload_mb} MiB, median of {args.repeats}:")
        print(f"  cp      {cp:8.1f} MiB/s")
        print(f"  upload  {up:8.1f} MiB/s  ({up / cp:.2f}x cp)")
        summary = {
            f"{name.replace(' ', '_')}_ms": {
                "median": round(statistics.median(v) * 1e3, 3),
                "p99": round(percentile(v, 0.99) * 1e3, 3),
            }
            for name, v in lat.items()
        }
        summary.update(
            benchmark="server",
            jobs=args.jobs,
            upload_mib_s=round(up, 1),
            cp_mib_s=round(cp, 1),
            upload_vs_cp=round(up / cp, 3),
        )
        print(json.dumps(summary))
    finally:
        server.stop()  # the fake masters have all ended (checked above)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
