"""Shared helpers of the benchmarks: data preparation, local jobs (submitted detached through
the client, then watched through their job directory and master), statistics, result printing."""
from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL_ZOO = os.path.join(REPO, "model_zoo")
DEFAULT_CACHE = os.path.join(
    os.path.expanduser("~"), ".cache", "elasticdl", "bench", "fashion_mnist"
)

# Run from a checkout without installing anything: the sources and the model zoo come first.
for _path in (MODEL_ZOO, os.path.join(REPO, "src", "python")):
    if _path not in sys.path:
        sys.path.insert(0, _path)


def python_env() -> Dict[str, str]:
    """Environment for child processes: the repository's sources and model zoo importable."""
    env = dict(os.environ)
    paths = [os.path.join(REPO, "src", "python"), MODEL_ZOO]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def prepare_fashion_mnist(output_dir: str = DEFAULT_CACHE) -> str:
    """The Fashion-MNIST RecordIO shards (prepared once, then reused from the cache)."""
    from elasticdl.data.datasets import prepare

    prepare("fashion_mnist", output_dir, progress=False)
    return output_dir


def subset_dir(train_dir: str, num_files: int, out_dir: str) -> str:
    """A directory holding symlinks to the first ``num_files`` shard files of ``train_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    names = sorted(n for n in os.listdir(train_dir) if not n.startswith("."))[:num_files]
    for name in names:
        link = os.path.join(out_dir, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join(train_dir, name), link)
    return out_dir


FINAL_PHASES = ("Succeeded", "Failed", "Cancelled")


def submit_local_job(
    home: str, name: str, flags: Sequence[str], env: Optional[Dict[str, str]] = None
) -> str:
    """``elasticdl train --platform=local <flags> --job_name=<name> --detach`` with
    ELASTICDL_HOME=``home`` (``env``: more variables for the client and the job); returns the
    job's directory. A failed submit raises CalledProcessError."""
    child_env = python_env()
    child_env["ELASTICDL_HOME"] = home
    child_env.update(env or {})
    # The master (and the PS and workers it starts) run from this checkout's sources with this
    # interpreter, never a dist/ master.pex that may predate them: a client run from sources
    # prefers this interpreter when it has TensorFlow (elasticdl.jobs.master_runtime).
    child_env.pop("ELASTICDL_MASTER_PEX", None)
    os.makedirs(home, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "elasticdl.client",
            "train",
            "--platform=local",
            f"--model_zoo={MODEL_ZOO}",
            *flags,
            f"--job_name={name}",
            "--detach",
        ],
        env=child_env,
        cwd=home,
        check=True,
        capture_output=True,
        text=True,
    )
    return os.path.join(home, "jobs", name)


def job_status(job_dir: str) -> dict:
    """The job's status.json as the master last wrote it ({} before its first write)."""
    try:
        with open(os.path.join(job_dir, "status.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def final_phase(job_dir: str) -> str:
    """The job's phase once it is final, else ''."""
    phase = job_status(job_dir).get("phase", "")
    return phase if phase in FINAL_PHASES else ""


def wait_final(job_dir: str, deadline: float) -> str:
    """The job's final phase, waited for until ``deadline`` (time.time()); '' if not final."""
    # The master writes its final status and exit code last: wait for the exit code file.
    while time.time() < deadline:
        if os.path.exists(os.path.join(job_dir, "exit_code")):
            return final_phase(job_dir)
        time.sleep(0.2)
    return final_phase(job_dir)


def master_stub(job_dir: str, deadline: float):
    """(channel, MasterStub) of the job's master, once its status.json names its port."""
    import grpc
    from elasticdl.common import auth
    from elasticdl.common import job_dir as job_files
    from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc

    status = os.path.join(job_dir, job_files.STATUS_FILE)
    while time.time() < deadline:
        try:
            with open(status) as f:
                port = json.load(f)["master"]["port"]
            # The master serves only holders of the job's secret (its owner may read it).
            secret = auth.read_secret_file(os.path.join(job_dir, job_files.SECRET_FILE))
            channel = auth.authenticated_channel(grpc.insecure_channel(f"127.0.0.1:{port}"), secret)
            return channel, pb_grpc.MasterStub(channel)
        except (OSError, ValueError, KeyError):
            time.sleep(0.2)
    raise RuntimeError(f"the master never wrote {status}")


def steady_state(
    job_dir: str, warmup_records: int, deadline: float
) -> Tuple[float, int, float, int]:
    """Times a job's training from the master's ``get_job_status``: (t0, r0, t1, r1), the
    perf_counter and records trained when ``warmup_records`` were passed and when every
    expected record was trained. Raises RuntimeError unless the job then Succeeded."""
    import grpc
    from elasticdl.proto import elasticdl_pb2 as pb

    channel, stub = master_stub(job_dir, deadline)
    t0 = r0 = t1 = r1 = None
    try:
        while time.time() < deadline:
            try:
                s = stub.get_job_status(pb.JobStatusRequest(), timeout=5)
            except grpc.RpcError:
                if final_phase(job_dir):
                    break
                time.sleep(0.2)
                continue
            now = time.perf_counter()
            if t0 is None and s.records_trained >= warmup_records:
                t0, r0 = now, s.records_trained
            if s.records_expected and s.records_trained >= s.records_expected:
                t1, r1 = now, s.records_trained
                break
            if s.phase in ("Failed", "Cancelled"):
                break
            time.sleep(0.1)
    finally:
        channel.close()
    phase = wait_final(job_dir, deadline)
    if phase != "Succeeded" or t0 is None or t1 is None or t1 <= t0:
        name = os.path.basename(job_dir)
        raise RuntimeError(f"job {name} ended {phase or 'unfinished'}; see {job_dir}/logs")
    return t0, r0, t1, r1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def print_table(title: str, header: Sequence[str], rows: List[Sequence]) -> None:
    cells = [list(map(str, header))] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(title)
    for i, row in enumerate(cells):
        print("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths)))
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))
    sys.stdout.flush()


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.0f}"
    return str(value)


def print_json(summary: dict) -> None:
    print(json.dumps(summary, sort_keys=True))
    sys.stdout.flush()
