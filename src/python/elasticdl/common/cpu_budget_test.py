import os
import subprocess
import sys

import pytest
from elasticdl.common import cpu_budget
from elasticdl.common.cpu_budget import (
    INTRA_OP_ENV,
    WORKER_CPUS_ENV,
    TrainingThreads,
    apply_training_split,
    available_cpus,
    cgroup_cpu_limit,
    share_per_worker,
    split_for_training,
)


def _write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


@pytest.mark.parametrize(
    "files, expected",
    [
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu.max": "garbage\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.0),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_cgroup_cpu_limit_v1_and_v2(tmp_path, files, expected):
    for rel, text in files.items():
        _write(str(tmp_path), rel, text)
    assert cgroup_cpu_limit(str(tmp_path)) == expected


def test_available_cpus_is_capped_by_the_quota_rounded_up(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_budget, "_affinity_cpus", lambda: 64)
    _write(str(tmp_path), "cpu.max", "150000 100000")
    assert available_cpus(str(tmp_path)) == 2  # a pod limited to 1.5 CPUs on a 64-core node
    _write(str(tmp_path), "cpu.max", "max 100000")
    assert available_cpus(str(tmp_path)) == 64
    _write(str(tmp_path), "cpu.max", "10000 100000")  # 0.1 CPU: still one thread
    assert available_cpus(str(tmp_path)) == 1
    monkeypatch.setattr(cpu_budget, "_affinity_cpus", lambda: 1)
    _write(str(tmp_path), "cpu.max", "800000 100000")
    assert available_cpus(str(tmp_path)) == 1  # the quota never adds CPUs


def test_a_local_workers_share_caps_its_cpus(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_budget, "_affinity_cpus", lambda: 16)
    root = str(tmp_path)  # no cgroup quota
    assert available_cpus(root, environ={}) == 16
    assert available_cpus(root, environ={WORKER_CPUS_ENV: "4"}) == 4
    assert available_cpus(root, environ={WORKER_CPUS_ENV: "64"}) == 16  # never adds CPUs
    for bad in ("0", "-2", "two", ""):
        assert available_cpus(root, environ={WORKER_CPUS_ENV: bad}) == 16
    assert [share_per_worker(w, cpus=16) for w in (1, 3, 4, 16, 40, 0)] == [16, 5, 4, 1, 1, 16]
    env = {WORKER_CPUS_ENV: "4"}
    monkeypatch.setattr(cpu_budget, "CGROUP_ROOT", root)
    assert apply_training_split(env) == TrainingThreads(data=2, step=2)


@pytest.mark.parametrize(
    "cpus, data, step", [(1, 1, 1), (2, 1, 1), (3, 1, 2), (4, 2, 2), (16, 8, 8), (0, 1, 1)]
)
def test_split_for_training(cpus, data, step):
    assert split_for_training(cpus) == TrainingThreads(data=data, step=step)


def test_apply_sets_the_intra_op_pool_unless_the_user_did():
    env = {}
    assert apply_training_split(env, cpus=4) == TrainingThreads(data=2, step=2)
    assert env[INTRA_OP_ENV] == "2"
    env = {INTRA_OP_ENV: "6"}
    assert apply_training_split(env, cpus=4) == TrainingThreads(data=2, step=6)
    assert env[INTRA_OP_ENV] == "6"


def _tensorflow_threads(intra_op: int) -> int:
    code = (
        "import os, tensorflow as tf; a = tf.random.uniform((256, 256)); (a @ a).numpy(); "
        "print(len(os.listdir('/proc/self/task')))"
    )
    env = dict(os.environ, **{INTRA_OP_ENV: str(intra_op), "TF_CPP_MIN_LOG_LEVEL": "3"})
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip().splitlines()[-1])


def test_tensorflow_sizes_its_intra_op_pool_from_the_environment():
    # The worker relies on TensorFlow reading TF_NUM_INTRAOP_THREADS when its runtime starts
    # (tf.config reports 0 then, so count the process's threads): a TensorFlow that stopped
    # reading it would silently undo the split.
    assert _tensorflow_threads(5) - _tensorflow_threads(1) >= 4
