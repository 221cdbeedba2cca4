"""Real worker processes form a group through the master's rendezvous (real gRPC servicer and
torch TCPStore on 127.0.0.1) and allreduce/broadcast; when one leaves, the other re-forms alone
in the next generation. With backend "auto", two workers on one host share a GPU (or have none)
and get Gloo; one worker with a GPU gets NCCL (that test runs only where torch sees a GPU).
A group that forms broadcasts the model's non-trainable variables (BatchNormalization
statistics) with the rest of rank 0's state."""
import importlib.util
import json
import subprocess
import sys
import textwrap

import elasticdl.worker.allreduce_group  # noqa: F401  (run by the subprocesses; tells the build)
import pytest
from elasticdl.master.rendezvous import Rendezvous, RendezvousConfig, RendezvousStore
from elasticdl.master.server import create_master_server
from elasticdl.master.servicer import MasterServicer
from elasticdl.master.task_manager import TaskManager, TaskManagerConfig
from elasticdl.platform.local import child_pythonpath

WORKER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from elasticdl.worker.allreduce_group import AllreduceMasterClient, CommGroup, GroupConfig

    addr, worker_id, backend = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    master = AllreduceMasterClient(addr, worker_id, retry_timeout=30)
    group = CommGroup(master, GroupConfig(backend=backend, join_timeout_s=60, collective_timeout_s=60))
    group.join()
    group.acknowledge()
    out = {"rank": group.rank, "world": group.world_size, "gen": group.rendezvous_id}
    out["backend"] = group.backend
    buf = np.full(5, float(worker_id + 1), np.float32)
    group.allreduce_(buf)
    out["sum"] = buf.tolist()
    state = np.array([float(worker_id)], np.float64)
    group.broadcast_(state, root=0)
    out["bcast"] = float(state[0])
    if worker_id == 0:
        group.leave()
    else:
        group.drop(failed=False)
        group.join()  # the next generation, without worker 0
        group.acknowledge()
        solo = np.ones(3, np.float32)
        group.allreduce_(solo)
        out.update(gen2=group.rendezvous_id, world2=group.world_size, rank2=group.rank, solo=solo.tolist())
        group.leave()
    print("RESULT " + json.dumps(out), flush=True)
"""
)


def _run_workers(tmp_path, worker_ids, backend, script=WORKER):
    """Each worker's RESULT dict and the rendezvous' history."""
    store = RendezvousStore("127.0.0.1")
    rdzv = Rendezvous(RendezvousConfig("127.0.0.1", store.port, settle_s=0.3))
    tm = TaskManager(TaskManagerConfig(records_per_task=1), training_shards=[("s", 0, 1)])
    server, port = create_master_server(
        MasterServicer(tm, rendezvous=rdzv), 0, "127.0.0.1", secret=None
    )
    script_path = tmp_path / "w.py"
    script_path.write_text(script)
    env = {"PYTHONPATH": child_pythonpath(), "PATH": "/usr/bin:/bin"}
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, str(script_path), f"127.0.0.1:{port}", str(w), backend],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
            for w in worker_ids
        ]
        outs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.stop(0)
        store.close()
    results = []
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
        results.append(json.loads(out.split("RESULT ", 1)[1]))
    return results, rdzv.history


@pytest.mark.parametrize("backend", ["gloo", "auto"])
def test_two_processes_allreduce_through_master_rendezvous(tmp_path, backend):
    (r0, r1), history = _run_workers(tmp_path, (0, 1), backend)
    # auto: two workers of one host have no GPU, or the same one, which NCCL refuses.
    assert r0["backend"] == r1["backend"] == "gloo"
    assert r0["gen"] == r1["gen"] == 1 and r0["world"] == r1["world"] == 2
    assert sorted([r0["rank"], r1["rank"]]) == [0, 1]
    assert r0["sum"] == r1["sum"] == [3.0] * 5
    rank0_worker = 0 if r0["rank"] == 0 else 1
    assert r0["bcast"] == r1["bcast"] == float(rank0_worker)
    # Worker 0 left: generation 2 holds worker 1 alone, as rank 0.
    assert (r1["gen2"], r1["world2"], r1["rank2"]) == (2, 1, 0)
    assert r1["solo"] == [1.0] * 3
    assert history == [(1, [history[0][1][0], history[0][1][1]]), (2, [1])]
    assert sorted(history[0][1]) == [0, 1]


# Two AllreduceTrainers of a BatchNormalization model, each with its own moving statistics: once
# both are in one group, both hold rank 0's (non-trainable variables are broadcast with the rest).
BN_WORKER = textwrap.dedent(
    """
    import json, sys, time
    import keras
    import numpy as np
    from elasticdl.common.model_utils import ModelSpec
    from elasticdl.worker.allreduce_group import AllreduceMasterClient, CommGroup, GroupConfig
    from elasticdl.worker.allreduce_trainer import AllreduceTrainer

    addr, worker_id, backend = sys.argv[1], int(sys.argv[2]), sys.argv[3]

    def model_fn():
        inp = keras.Input(shape=(4,))
        h = keras.layers.BatchNormalization(name="bn")(keras.layers.Dense(8, name="hidden")(inp))
        return keras.Model(inp, keras.layers.Dense(2, name="out")(h))

    spec = ModelSpec(module=None, model_fn=model_fn, loss=None,
                     optimizer=lambda: keras.optimizers.SGD(0.1), feed=None, eval_metrics_fn=None)
    master = AllreduceMasterClient(addr, worker_id, retry_timeout=30)
    group = CommGroup(master, GroupConfig(backend=backend, join_timeout_s=60, collective_timeout_s=60))
    trainer = AllreduceTrainer(spec, group, master)
    trainer.ensure_model(np.zeros((2, 4), np.float32))
    bn = trainer.model.get_layer("bn")
    bn.moving_mean.assign(np.full(8, worker_id + 1.0, np.float32))
    bn.moving_variance.assign(np.full(8, 10.0 * (worker_id + 1), np.float32))
    while True:  # the first to come is alone until the other joins: then both regroup
        trainer._ensure_member()
        if group.world_size == 2:
            break
        while not group.new_generation_available():
            time.sleep(0.05)
        group.drop(failed=False)
    out = {"rank": group.rank, "mean": bn.moving_mean.numpy().tolist(),
           "variance": bn.moving_variance.numpy().tolist()}
    trainer.leave()
    print("RESULT " + json.dumps(out), flush=True)
"""
)


@pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None,
    reason="needs TensorFlow (benchmarks/ops/gpu_checks.sh runs this file where there is none)",
)
def test_a_group_that_forms_broadcasts_non_trainable_variables(tmp_path):
    (r0, r1), _ = _run_workers(tmp_path, (0, 1), "gloo", script=BN_WORKER)
    root = 0 if r0["rank"] == 0 else 1  # the worker whose statistics everybody takes
    assert sorted([r0["rank"], r1["rank"]]) == [0, 1]
    for r in (r0, r1):
        assert r["mean"] == [root + 1.0] * 8
        assert r["variance"] == [10.0 * (root + 1)] * 8


def _torch_sees_a_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not _torch_sees_a_gpu(), reason="torch sees no CUDA device (CI has none)")
def test_a_worker_with_a_gpu_of_its_own_allreduces_through_nccl(tmp_path):
    (r0,), history = _run_workers(tmp_path, (0,), "auto")
    assert r0["backend"] == "nccl", r0
    assert (r0["gen"], r0["world"], r0["rank"]) == (1, 1, 0)
    assert r0["sum"] == [1.0] * 5 and r0["bcast"] == 0.0
    assert history == [(1, [0])]


# Worker 1 leaves the job as far as the master knows, but its process and sockets stay (a peer
# on a lost node sends no reset). Worker 0's next allreduce must end on the master's word,
# not on Gloo's timeout (10 minutes here) nor on worker 1's exit 20 s later.
GONE_PEER_WORKER = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from elasticdl.proto import elasticdl_pb2 as pb
    from elasticdl.worker.allreduce_group import (
        AllreduceMasterClient, CollectiveError, CommGroup, GroupConfig)

    addr, worker_id, backend = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    master = AllreduceMasterClient(addr, worker_id, retry_timeout=30)
    group = CommGroup(master, GroupConfig(backend=backend, join_timeout_s=60,
                                          collective_timeout_s=600, watch_interval_s=0.5))
    while True:  # until both are in one generation
        group.join()
        group.acknowledge()
        if group.world_size == 2:
            break
        while not group.new_generation_available():
            time.sleep(0.05)
        group.drop(failed=False)
    buf = np.ones(2, np.float32)
    group.allreduce_(buf)
    out = {"first": buf.tolist()}
    if worker_id == 1:
        master.report_training_loop_status(pb.LOOP_END, 0, group.host)
        time.sleep(20)
    else:
        time.sleep(1)  # the master has heard of worker 1's end
        try:
            group.allreduce_(buf)
            out["second"] = "completed"
        except CollectiveError as e:
            out["second"] = str(e)
    print("RESULT " + json.dumps(out), flush=True)
"""
)


def test_a_collective_ends_when_the_master_says_a_member_left(tmp_path):
    (r0, r1), _ = _run_workers(tmp_path, (0, 1), "gloo", script=GONE_PEER_WORKER)
    assert r0["first"] == r1["first"] == [2.0, 2.0]
    assert "is over (a member left the job" in r0["second"], r0


GONE_BEFORE_BUILD_WORKER = textwrap.dedent(
    """
    import datetime, json, sys, time
    import torch.distributed as dist
    from elasticdl.common.allreduce_keys import group_store_prefix
    from elasticdl.proto import elasticdl_pb2 as pb
    from elasticdl.worker.allreduce_group import (
        AllreduceMasterClient, CollectiveError, CommGroup, GroupConfig)

    addr, worker_id, backend = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    master = AllreduceMasterClient(addr, worker_id, retry_timeout=30)
    out = {}
    if worker_id == 1:
        # Joins, is given a rank in a generation of two, and leaves the job before building the
        # group (as a worker dies while the others build it): it never publishes its keys.
        master.report_training_loop_status(pb.LOOP_START, 0, "127.0.0.1")
        while True:
            resp = master.get_comm_rank("127.0.0.1")
            if resp.world_size == 2 and resp.rank_id >= 0:
                break
            if resp.world_size == 1 and resp.rank_id == 0:  # alone: answer it, as if built
                master.report_training_loop_status(pb.LOOP_START, resp.rendezvous_id, "127.0.0.1")
            time.sleep(0.05)
        store = dist.PrefixStore(
            group_store_prefix(resp.rendezvous_id, ""),
            dist.TCPStore(resp.rendezvous_addr or "127.0.0.1", resp.rendezvous_port,
                          is_master=False, timeout=datetime.timedelta(seconds=60)))
        peer = 1 - resp.rank_id
        store.wait([f"gpu/{peer}"], datetime.timedelta(seconds=60))  # worker 0 is building
        master.report_training_loop_status(pb.LOOP_END, 0, "127.0.0.1")
        time.sleep(5)
    else:
        group = CommGroup(master, GroupConfig(backend=backend, join_timeout_s=60,
                                              collective_timeout_s=600, watch_interval_s=0.5))
        try:
            while True:
                group.join()
                group.acknowledge()
                while not group.new_generation_available():
                    time.sleep(0.05)
                group.drop(failed=False)
        except CollectiveError as e:
            out["build"] = str(e)
        group.join()  # the next generation: alone
        out["world_after"] = group.world_size
        group.leave()
    print("RESULT " + json.dumps(out), flush=True)
"""
)


@pytest.mark.parametrize("backend", ["gloo", "auto"])
def test_building_a_group_ends_when_the_master_says_a_member_left(tmp_path, backend):
    # Without the master's word the build would wait for the member's keys for the whole
    # collective timeout (600 s here), past the test's 240 s.
    (r0, _), _ = _run_workers(tmp_path, (0, 1), backend, script=GONE_BEFORE_BUILD_WORKER)
    assert "building the group of generation" in r0["build"], r0
    assert "is over (a member left the job" in r0["build"], r0
    assert r0["world_after"] == 1, r0
