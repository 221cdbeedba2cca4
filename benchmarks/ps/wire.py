"""Wire: the PS's push and pull of embedding rows against a raw gRPC echo of the same bytes.

    python benchmarks/ps/wire.py [--sizes 1K,16K,256K,4M,64M] [--dim 16] [--repeats 5]
        [--plot out.png] [--profile DIR]

Per payload size B (the rows' float32 bytes, N = B / (4 * dim) rows), in the same run and
interleaved:

  echo         a raw gRPC unary call (a generic bytes handler, no protobuf) to a server process
               built like the PS's (thread-pool server, the same message limits, the job-secret
               interceptor), sending and answering the byte counts of the PS call it stands for;
  pull         `PSClient.pull_embedding_vectors` of N existing rows (the real worker client ->
               a real `python -m elasticdl.ps.main` process): ids up (8 N bytes), rows down (B);
               on the PS's stream channel, as a worker on another host pulls;
  push         `PSClient.push_gradients` of N rows' gradients (B + 8 N bytes up), SGD applied,
               on the stream channel likewise;
  dense, shm   a dense tensor of B bytes pushed with its parameters pulled back
               (`pull_dense=True`) through the same-host path (shared-memory region + local
               push channel), against an echo of B up and B down;
  dense, msg   the same push in messages on the stream channel (`ELASTICDL_SHARED_MEMORY=0`'s
               path);
  *_grpc       pull, push and dense msg by gRPC (`ELASTICDL_STREAM_CHANNEL=0`'s path).

And, for each case, a second baseline that is not gRPC:

  stream       the echo's byte counts over one TCP connection to the echo process as
               length-prefixed frames (the local channel's framing, on 127.0.0.1 instead of a
               Unix socket; the connection's first frame carries the job secret): what the same
               round trip costs without grpcio, the bound on a framed-stream transport.

Ratio = echo seconds per call / PS seconds per call (target >= 0.8 at every size): blocks of
calls (up to ~1 MB of payload each), an echo block then its PS block, for --repeats (more for
small payloads) rounds; the ratio is the median of the rounds' ratios, the times are medians.
echo/stream: the same for the gRPC echo against the stream (its block follows the PS block).
CPU ms: the client's and both servers' CPU per call (from /proc), a figure the machine's load
moves less than wall time; cpu ratio = echo CPU / PS CPU.
Prints a table, then a JSON line; --plot writes the ratios and MB/s per size as a PNG.
--profile DIR writes a cProfile of the client side of each PS case at the largest size.
"""
from __future__ import annotations

import argparse
import cProfile
import hmac
import os
import secrets
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent import futures

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "runtime"))
import common  # noqa: E402  (puts the sources on the path)

TARGET_RATIO = 0.8
TABLE = "emb"
DENSE = "w"
ECHO_METHOD = "/bench.Echo/Echo"
CASES = ("pull", "push", "dense_shm", "dense_msg", "pull_grpc", "push_grpc", "dense_grpc")
# Each PS case's echo: (bytes up, bytes down) as functions of payload B and rows N.
ECHO_SHAPES = {
    "pull": lambda b, n: (8 * n, b),
    "push": lambda b, n: (b + 8 * n, 16),
    "dense_shm": lambda b, n: (b, b),
    "dense_msg": lambda b, n: (b, b),
}
for _case in ("pull", "push", "dense_msg"):
    ECHO_SHAPES[_case.replace("_msg", "") + "_grpc"] = ECHO_SHAPES[_case]


class UsageError(Exception):
    pass


def parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    if not digits.isdigit() or int(digits) <= 0:
        raise UsageError(f"--sizes must be comma-separated sizes like 1K,64M, got {text!r}")
    return int(digits) * scale


# ------------------------------------------------------------------------------ stream echo
_STREAM_ASK = struct.Struct("<QQ")  # bytes up (that follow), bytes down
_STREAM_ANSWER = struct.Struct("<Q")


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("stream closed")
        got += n


def _serve_stream_connection(conn: socket.socket, secret: bytes) -> None:
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.settimeout(30)
        hello = bytearray(len(secret))
        try:
            _recv_into(conn, memoryview(hello))
        except (ConnectionError, OSError):
            return
        if not hmac.compare_digest(bytes(hello), secret):
            return  # not the job's: closed without an answer
        conn.settimeout(None)
        buf, ask, answers = bytearray(1 << 20), bytearray(_STREAM_ASK.size), {}
        try:
            while True:
                _recv_into(conn, memoryview(ask))
                up, down = _STREAM_ASK.unpack(ask)
                if up > len(buf):
                    buf = bytearray(up)
                _recv_into(conn, memoryview(buf)[:up])
                answer = answers.get(down)
                if answer is None:
                    answer = answers.setdefault(down, _STREAM_ANSWER.pack(down) + bytes(down))
                conn.sendall(answer)
        except (ConnectionError, OSError):
            return


def serve_stream(listener: socket.socket, secret: bytes) -> None:
    """Answer each frame (up, down, `up` bytes) with `down` bytes, on 127.0.0.1, for callers
    whose first frame is the job secret."""
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_serve_stream_connection, args=(conn, secret), daemon=True).start()


class StreamClient:
    def __init__(self, port: int, secret: bytes):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(secret)
        self.buf = bytearray(1 << 20)
        self.head = bytearray(_STREAM_ANSWER.size)
        self._requests: dict[int, bytes] = {}

    def call(self, up: int, down: int) -> None:
        req = self._requests.get(up)
        if req is None:
            req = self._requests.setdefault(up, bytes(up))
        self.sock.sendall(_STREAM_ASK.pack(up, down))
        self.sock.sendall(req)
        _recv_into(self.sock, memoryview(self.head))
        (size,) = _STREAM_ANSWER.unpack(self.head)
        if size > len(self.buf):
            self.buf = bytearray(size)
        _recv_into(self.sock, memoryview(self.buf)[:size])
        assert size == down

    def close(self) -> None:
        self.sock.close()


# ------------------------------------------------------------------------------ echo server
def serve_echo(port: int, stream_port: int = 0) -> None:
    """The raw gRPC baseline: answer a request with as many bytes as its first 8 name."""
    import grpc
    from elasticdl.common import auth
    from elasticdl.ps.server import GRPC_MAX_MESSAGE_BYTES

    answers: dict[int, bytes] = {}

    def echo(request: bytes, context) -> bytes:
        size = int.from_bytes(request[:8], "little")
        answer = answers.get(size)
        if answer is None:
            answer = answers.setdefault(size, bytes(size))
        return answer

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=64),
        options=[
            ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
        ],
        interceptors=[auth.TokenServerInterceptor(os.environ[auth.JOB_SECRET_ENV])],
    )
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    if stream_port:
        listener = socket.create_server(("127.0.0.1", stream_port))
        secret = os.environ[auth.JOB_SECRET_ENV].encode()
        threading.Thread(target=serve_stream, args=(listener, secret), daemon=True).start()
    server.wait_for_termination()


# ------------------------------------------------------------------------------ processes
class Servers:
    """The PS and the echo server, each in its own process on 127.0.0.1."""

    def __init__(self):
        from elasticdl.common import auth

        self.secret = secrets.token_hex(16)
        env = dict(common.python_env(), **{auth.JOB_SECRET_ENV: self.secret})
        env.pop("ELASTICDL_SHARED_MEMORY", None)
        self.ps_port, self.echo_port = common.free_port(), common.free_port()
        self.stream_port = common.free_port()
        ps_argv = [
            sys.executable,
            "-m",
            "elasticdl.ps.main",
            f"--port={self.ps_port}",
            "--bind_host=127.0.0.1",
            "--opt_type=SGD",
            "--opt_args=learning_rate=0.001;",
            "--use_async=true",
            "--log_level=WARNING",
        ]
        echo_argv = [
            sys.executable,
            os.path.abspath(__file__),
            f"--serve_echo={self.echo_port}",
            f"--serve_stream={self.stream_port}",
        ]
        self.procs = [
            subprocess.Popen(ps_argv, env=env),
            subprocess.Popen(echo_argv, env=env),
        ]

    def close(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class Bench:
    def __init__(self, servers: Servers, dim: int):
        import grpc
        import numpy as np
        from elasticdl.worker.grpc_utils import build_channel
        from elasticdl.worker.ps_client import EmbeddingTableInfo, PSClient, wait_for_ps

        self.np = np
        self.dim = dim
        addr = [f"127.0.0.1:{servers.ps_port}"]
        self.msg = PSClient(addr, secret=servers.secret, shared_memory=False)
        self.shm = PSClient(addr, worker_id=1, secret=servers.secret, shared_memory=True)
        self.grpc = PSClient(
            addr, worker_id=2, secret=servers.secret, shared_memory=False, stream_channel=False
        )
        wait_for_ps(self.msg, 60)
        self.echo_channel = build_channel(f"127.0.0.1:{servers.echo_port}", servers.secret)
        grpc.channel_ready_future(self.echo_channel).result(timeout=60)
        self.echo_stub = self.echo_channel.unary_unary(ECHO_METHOD)
        self.stream = StreamClient(servers.stream_port, servers.secret.encode())
        self.info = EmbeddingTableInfo(TABLE, dim)
        self._requests: dict[int, bytes] = {}

    def close(self) -> None:
        self.msg.close()
        self.shm.close()
        self.grpc.close()
        self.echo_channel.close()
        self.stream.close()

    # ---------------------------------------------------------------- the calls
    def echo(self, up: int, down: int) -> None:
        req = self._requests.get(up)
        if req is None:
            req = self._requests.setdefault(up, bytes(max(up, 8)))
        answer = self.echo_stub(down.to_bytes(8, "little") + req[8:], timeout=120)
        assert len(answer) == down

    def setup_size(self, payload: int) -> dict:
        """Rows of the table created, the dense model of `payload` bytes on the PS."""
        np = self.np
        n = max(1, payload // (4 * self.dim))
        ids = np.arange(n, dtype=np.int64)
        grads = np.full((n, self.dim), 1e-3, dtype=np.float32)
        dense = np.zeros(max(1, payload // 4), dtype=np.float32)
        # Each size gets fresh servers (see measure_size), so this is the PS's first model.
        self.msg.push_model({DENSE: dense}, [self.info])
        self.shm.set_dense_layout({DENSE: dense})
        self.msg.pull_embedding_vectors(TABLE, ids, self.dim)  # rows exist before timing
        return {"n": n, "ids": ids, "grads": grads, "dense": {DENSE: dense + 1e-3}}

    def run(self, case: str, data: dict) -> None:
        client = self.grpc if case.endswith("_grpc") else self.msg
        if case.startswith("pull"):
            # As the trainer pulls: the embedding layer's ids come from tf.unique.
            rows = client.pull_embedding_vectors(TABLE, data["ids"], self.dim, ids_unique=True)
            assert rows.shape == (data["n"], self.dim)
        elif case.startswith("push"):
            res = client.push_gradients({}, {TABLE: (data["grads"], data["ids"])})
            assert res.accepted
        else:
            client = self.shm if case == "dense_shm" else client
            res = client.push_gradients(data["dense"], pull_dense=True)
            assert res.accepted and res.pulled is not None
            if case == "dense_shm":
                assert client.shared_memory_ps() == [0], "the same-host path did not attach"
        if case in ("pull", "push", "dense_msg"):
            assert self.msg._links[0].stream is not None or case == "pull", "no stream channel"


def _cpu_s(pids) -> float:
    """CPU seconds used so far by this process and the server processes `pids`."""
    ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return time.process_time() + ticks / os.sysconf("SC_CLK_TCK")


def _timed(fn, iters: int, pids) -> tuple[float, float]:
    """Wall and CPU (client + servers) seconds per call of `fn`, over `iters` calls."""
    cpu, start = _cpu_s(pids), time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters, (_cpu_s(pids) - cpu) / iters


def measure_size(servers_factory, payload: int, args) -> list[dict]:
    servers = servers_factory()
    bench = None
    try:
        bench = Bench(servers, args.dim)
        data = bench.setup_size(payload)
        n = data["n"]
        pids = [p.pid for p in servers.procs]
        # Short blocks, echo and PS call in turn, many rounds: on a shared machine the load
        # drifts between blocks, and a ratio of adjacent blocks cancels most of it.
        iters = max(1, min(50, (1 << 20) // payload))
        rounds = args.repeats * max(1, min(8, (16 << 20) // (payload * iters)))
        for case in CASES:  # warm-up: the shared-memory region attaches on the first push
            bench.run(case, data)
            bench.run(case, data)
        for case in CASES:  # and the stream's connection
            bench.stream.call(*ECHO_SHAPES[case](payload, n))
        # Per round: (echo wall, echo cpu, PS wall, PS cpu, stream wall).
        samples = {c: [] for c in CASES}
        for _ in range(rounds):
            for case in CASES:
                up, down = ECHO_SHAPES[case](payload, n)
                echo = _timed(lambda: bench.echo(up, down), iters, pids)
                ps = _timed(lambda: bench.run(case, data), iters, pids)
                stream = _timed(lambda: bench.stream.call(up, down), iters, pids)
                samples[case].append(echo + ps + stream[:1])
        if args.profile and payload == max(args.sizes):
            os.makedirs(args.profile, exist_ok=True)
            for case in CASES:
                prof = cProfile.Profile()
                prof.runcall(_timed, lambda: bench.run(case, data), max(iters, 3), [])
                prof.dump_stats(os.path.join(args.profile, f"client-{case}-{payload}.prof"))
        points = []
        for case in CASES:
            echo_s, echo_cpu, ps_s, ps_cpu, stream_s = (
                common.median([x[i] for x in samples[case]]) for i in range(5)
            )
            points.append(
                {
                    "case": case,
                    "payload_bytes": payload,
                    "rows": n,
                    "rounds": rounds,
                    "ps_ms": ps_s * 1e3,
                    "echo_ms": echo_s * 1e3,
                    "ps_mb_s": payload / ps_s / 1e6,
                    "echo_mb_s": payload / echo_s / 1e6,
                    "rows_per_s": n / ps_s if case in ("pull", "push") else None,
                    # The median of the rounds' ratios (each echo block beside its PS block).
                    "ratio": common.median([x[0] / x[2] for x in samples[case]]),
                    "ps_cpu_ms": ps_cpu * 1e3,
                    "echo_cpu_ms": echo_cpu * 1e3,
                    "cpu_ratio": sum(x[1] for x in samples[case])
                    / max(1e-9, sum(x[3] for x in samples[case])),
                    "stream_ms": stream_s * 1e3,
                    # How many times a framed stream's round trip the gRPC echo takes.
                    "echo_over_stream": common.median([x[0] / x[4] for x in samples[case]]),
                }
            )
        return points
    finally:
        if bench is not None:
            bench.close()
        servers.close()


def plot(points: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for case in CASES:
        pts = [p for p in points if p["case"] == case]
        xs = [p["payload_bytes"] for p in pts]
        ax1.plot(xs, [p["ratio"] for p in pts], marker="o", label=case)
        ax2.plot(xs, [p["ps_mb_s"] for p in pts], marker="o", label=f"PS {case}")
    echo = [p for p in points if p["case"] == "pull"]
    ax2.plot(
        [p["payload_bytes"] for p in echo],
        [p["echo_mb_s"] for p in echo],
        "k--",
        label="raw echo (pull's bytes)",
    )
    ax2.plot(
        [p["payload_bytes"] for p in echo],
        [p["payload_bytes"] / p["stream_ms"] / 1e3 for p in echo],
        "k:",
        label="framed TCP stream (pull's bytes)",
    )
    ax1.axhline(TARGET_RATIO, color="grey", linestyle=":", label="target 0.8")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("payload bytes (rows x dim x 4)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_ylabel("raw echo s / PS s")
    ax1.set_title("PS call vs raw gRPC echo of the same bytes")
    ax2.set_yscale("log")
    ax2.set_ylabel("MB/s (payload)")
    ax2.set_title("payload throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1K,16K,256K,4M,64M")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--plot", default="")
    p.add_argument("--profile", default="")
    p.add_argument("--serve_echo", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--serve_stream", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    except UsageError as e:
        p.error(str(e))
    if args.dim <= 0:
        p.error(f"--dim must be positive, got {args.dim}")
    if args.repeats <= 0:
        p.error(f"--repeats must be positive, got {args.repeats}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from elasticdl.common.malloc_tuning import tune_malloc

    # As the PS and worker processes do at start: the echo server and the client (which
    # stands for the worker) recycle megabyte buffers the same way.
    tune_malloc()
    if args.serve_echo:
        serve_echo(args.serve_echo, args.serve_stream)
        return 0
    points = []
    for payload in args.sizes:
        points.extend(measure_size(Servers, payload, args))
    rows = [
        (
            p["case"],
            p["payload_bytes"],
            p["rows"],
            p["ps_ms"],
            p["echo_ms"],
            p["ps_mb_s"],
            p["echo_mb_s"],
            p["ratio"],
            p["ps_cpu_ms"],
            p["echo_cpu_ms"],
            p["cpu_ratio"],
            p["stream_ms"],
            p["echo_over_stream"],
        )
        for p in points
    ]
    common.print_table(
        f"PS wire vs raw gRPC echo (dim {args.dim}, medians of {args.repeats})",
        (
            "case",
            "bytes",
            "rows",
            "PS ms",
            "echo ms",
            "PS MB/s",
            "echo MB/s",
            "ratio",
            "PS cpu ms",
            "echo cpu ms",
            "cpu ratio",
            "stream ms",
            "echo/stream",
        ),
        rows,
    )
    if args.plot:
        plot(points, args.plot)
    message = [p["ratio"] for p in points if p["case"] in ("pull", "push")]
    by_grpc = [p["ratio"] for p in points if p["case"] in ("pull_grpc", "push_grpc")]
    common.print_json(
        {
            "benchmark": "ps_wire",
            "dim": args.dim,
            "repeats": args.repeats,
            "points": points,
            "min_ratio_message_path": min(message),
            "min_ratio_grpc": min(by_grpc),
            "min_ratio_same_host": min(p["ratio"] for p in points if p["case"] == "dense_shm"),
            "target_ratio": TARGET_RATIO,
            "targets_met": min(message) >= TARGET_RATIO,
            "load_average": os.getloadavg()[0],
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
