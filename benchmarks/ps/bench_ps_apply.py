"""Throughput of gradient application on one ElasticDL parameter server.

    python benchmarks/ps/bench_ps_apply.py [--dense 10000000] [--ids 100000] [--dim 64] [--repeats 7]

For each optimizer (SGD, Adam) and each elasticdl.ops backend (native C++ kernels, and the
NumPy reference forced with ELASTICDL_OPS_BACKEND=reference, each in its own child process
because the backend is chosen at import), one PS is started (`elasticdl.ps.server.PSServer`,
asynchronous updates) and fed two kinds of push and one pull:

  dense      one float32 dense parameter of --dense elements;
  embedding  --ids uniform ids out of --rows of one --dim-wide table (rows created up front,
             so the timed pushes measure updates, not lazy row initialisation);
  summed     the same batches as a worker sends them: equal ids summed, in increasing order
             (`ops.sparse_aggregate`), which the PS checks and then updates without ranking.
  pull       the embedding rows of --ids such ids pulled back (what a worker does before
             each minibatch): id lookup + row gather + the response.

Each is timed two ways, in alternation:
  in-process  `ParameterServer.push_gradients(request)`: decode + validate + optimizer kernels
              (pulls: `ParameterServer.pull_embedding_vectors(name, ids)`);
  grpc        the same request through the real Pserver servicer over 127.0.0.1
              (serialisation, HTTP/2 transfer and the servicer added).

Reports medians of --repeats pushes/pulls as dense parameters/s and embedding rows/s, and the
native/reference speed-up of each. Prints a table, then one JSON summary as the LAST line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "..", "src", "python")
OPTIMIZERS = {"SGD": "learning_rate=0.01;", "Adam": "learning_rate=0.001;"}
TABLE = "emb"
CASES = (
    "dense_inprocess",
    "dense_grpc",
    "embedding_inprocess",
    "embedding_grpc",
    "summed_inprocess",
    "pull_inprocess",
    "pull_grpc",
)
DENSE = "dense/kernel"


# ------------------------------------------------------------------------------ child
def _child(args) -> dict:
    sys.path.insert(0, SRC)
    import grpc
    import numpy as np
    from elasticdl import ops
    from elasticdl.common import tensor_utils as tu
    from elasticdl.proto import elasticdl_pb2 as pb
    from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc
    from elasticdl.ps.server import GRPC_MAX_MESSAGE_BYTES, PSConfig, PSServer

    rng = np.random.default_rng(args.seed)
    dense_value = rng.standard_normal(args.dense, dtype=np.float32)
    dense_grad = rng.standard_normal(args.dense, dtype=np.float32)
    batches = [rng.integers(0, args.rows, args.ids, dtype=np.int64) for _ in range(3)]
    emb_grad = rng.standard_normal((args.ids, args.dim), dtype=np.float32)

    def request(dense=None, ids=None) -> pb.PushGradientsRequest:
        req = pb.PushGradientsRequest(learning_rate=0.0)
        if dense is not None:
            tu.ndarray_to_pb(dense, req.gradients.dense_parameters[DENSE])
        if ids is not None:
            tu.indexed_rows_to_pb(
                tu.IndexedRows(emb_grad, ids), req.gradients.embedding_tables[TABLE]
            )
        return req

    dense_req = request(dense=dense_grad)
    emb_reqs = [request(ids=b) for b in batches]
    summed_reqs = []
    for b in batches:
        ids, grads = ops.sparse_aggregate(b, emb_grad)
        req = pb.PushGradientsRequest(learning_rate=0.0)
        tu.indexed_rows_to_pb(tu.IndexedRows(grads, ids), req.gradients.embedding_tables[TABLE])
        summed_reqs.append(req)
    out = {"backend": ops.backend()}
    opts = [
        ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
    ]
    for opt, opt_args in OPTIMIZERS.items():
        server = PSServer(
            PSConfig(
                port=0,
                bind_host="127.0.0.1",
                use_async=True,
                opt_type=opt,
                opt_args=opt_args,
                log_every_versions=0,
            ),
            secret=None,
        )
        port = server.start()
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=opts)
        stub = pb_grpc.PserverStub(channel)
        try:
            model = pb.Model(version=0)
            model.embedding_table_infos.add(
                name=TABLE, dim=args.dim, initializer="zeros", dtype=pb.DT_FLOAT32
            )
            tu.ndarray_to_pb(dense_value, model.dense_parameters[DENSE])
            stub.push_model(model)
            # Create every row the timed pushes touch (and Adam's slots): measure updates only.
            with server.ps.lock:
                server.params.embedding_tables[TABLE].rows(np.concatenate(batches))
            for r in emb_reqs:
                server.ps.push_gradients(r)
            ps = server.ps

            def check(result):
                if not result.accepted:
                    raise RuntimeError("the PS rejected a benchmark push")

            cases = {
                "dense_inprocess": lambda: check(ps.push_gradients(dense_req)),
                "dense_grpc": lambda: check(stub.push_gradients(dense_req)),
            }
            k = {"i": 0}

            def emb(fn, reqs=emb_reqs):
                def run():
                    k["i"] += 1
                    check(fn(reqs[k["i"] % len(reqs)]))

                return run

            cases["embedding_inprocess"] = emb(ps.push_gradients)
            cases["embedding_grpc"] = emb(stub.push_gradients)
            cases["summed_inprocess"] = emb(ps.push_gradients, summed_reqs)

            def pull(grpc_stub):
                def run():
                    k["i"] += 1
                    ids = batches[k["i"] % len(batches)]
                    if grpc_stub is None:
                        rows = ps.pull_embedding_vectors(TABLE, ids)
                    else:
                        req = pb.PullEmbeddingVectorsRequest(name=TABLE)
                        tu.ndarray_to_pb(ids, req.ids)
                        rows = tu.pb_to_ndarray(grpc_stub.pull_embedding_vectors(req))
                    if rows.shape != (ids.size, args.dim):
                        raise RuntimeError(f"the PS pulled {rows.shape} rows")

                return run

            cases["pull_inprocess"] = pull(None)
            cases["pull_grpc"] = pull(stub)
            times = {name: [] for name in cases}
            for fn in cases.values():  # warm-up
                fn()
            for _ in range(args.repeats):
                for name, fn in cases.items():
                    t0 = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t0)
            res = {}
            for name, ts in times.items():
                med = statistics.median(ts)
                res[f"{name}_ms"] = med * 1e3
                if name.startswith("dense"):
                    res[f"{name}_params_per_s"] = args.dense / med
                else:
                    res[f"{name}_rows_per_s"] = args.ids / med
            out[opt] = res
        finally:
            channel.close()
            server.stop(0)
    return out


# ----------------------------------------------------------------------------- parent
def _run_child(backend: str, args) -> dict:
    env = dict(os.environ)
    env["ELASTICDL_OPS_BACKEND"] = backend
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH", "")) if p)
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        "--dense",
        str(args.dense),
        "--ids",
        str(args.ids),
        "--dim",
        str(args.dim),
        "--rows",
        str(args.rows),
        "--repeats",
        str(args.repeats),
        "--seed",
        str(args.seed),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{backend} run failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dense", type=int, default=10_000_000, help="elements of the dense parameter")
    ap.add_argument("--ids", type=int, default=100_000, help="ids per embedding push")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--rows", type=int, default=1_000_000, help="id space of the embedding pushes")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--timeout", type=float, default=900, help="seconds allowed to each backend run"
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args)))
        return
    native = _run_child("native", args)
    reference = _run_child("reference", args)
    if native["backend"] != "native":
        raise SystemExit(
            "elasticdl_native is not importable: build src/cc first (see benchmarks/ops/README.md)"
        )
    summary = {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d"),
        "dense": args.dense,
        "ids": args.ids,
        "dim": args.dim,
        "repeats": args.repeats,
    }
    print(f"{'optimizer':9s} {'case':22s} {'native':>12s} {'reference':>12s} {'speed-up':>9s}")
    for opt in OPTIMIZERS:
        entry = {"native": native[opt], "reference": reference[opt], "speedup": {}}
        for case in CASES:
            sp = reference[opt][f"{case}_ms"] / native[opt][f"{case}_ms"]
            entry["speedup"][case] = sp
            unit = "params/s" if case.startswith("dense") else "rows/s"
            key = f"{case}_{'params' if unit == 'params/s' else 'rows'}_per_s"
            print(
                f"{opt:9s} {case:22s} {native[opt][key]:12.3g} {reference[opt][key]:12.3g} {sp:8.2f}x  ({unit})"
            )
        summary[opt] = entry
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
