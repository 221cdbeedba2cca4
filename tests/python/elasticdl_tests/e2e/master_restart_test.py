"""The master survives its own death: a local training job whose master is
SIGKILLed at random points of training is started again by the job's owner, resumes from its
journal, adopts its PS and workers, and finishes with every record trained once.

ELASTICDL_E2E_MASTER_KILLS (default 2) sets how often; ELASTICDL_E2E_MASTER_RESTART_README=1
runs the README job instead (all of Fashion-MNIST, --evaluation_steps=200) and, after it, the
same job undisturbed, whose test accuracy the killed one must match within 1 point (the
issue's run: 5 kills; minutes, so not in CI)."""
import json
import os
import random
import time
from pathlib import Path

from .conftest import kill, replica

JOB = "master-restart"
KILLS = int(os.environ.get("ELASTICDL_E2E_MASTER_KILLS", "2"))
README_JOB = os.environ.get("ELASTICDL_E2E_MASTER_RESTART_README") == "1"
TASK_RECORDS = 128


def _job_processes(job_dir: Path) -> dict[str, list[int]]:
    """Live processes that carry this job's replica exit-status file, by replica name."""
    found: dict[str, list[int]] = {}
    prefix = f"ELASTICDL_EXIT_STATUS_FILE={job_dir}/logs/".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue
        for item in env:
            if item.startswith(prefix):
                name = item[len(prefix) :].decode().removesuffix(".exit")
                found.setdefault(name, []).append(int(entry))
    return found


def _flags(data, evaluation_steps):
    return (
        f"--training_data={data['train']}",
        f"--validation_data={data['test']}",
        "--num_epochs=1",
        "--minibatch_size=64",
        "--num_minibatches_per_task=2",
        "--num_workers=2",
        "--num_ps_pods=1",
        f"--evaluation_steps={evaluation_steps}",
    )


def test_job_survives_master_kills(cli, small_data, fashion_mnist):
    rng = random.Random(int(os.environ.get("ELASTICDL_E2E_SEED", "0")) or None)
    if README_JOB:
        data, steps = {"train": fashion_mnist / "train", "test": fashion_mnist / "test"}, 200
        records, test_records = 60000, 10000
    else:
        data, steps, records, test_records = small_data, 40, 16384, 4096  # 4 + 1 files
    cli.submit("train", JOB, *_flags(data, steps))
    job_dir = cli.job_dir(JOB).resolve()
    # Kill points spread over training (records trained), in random order of magnitude.
    points = sorted(rng.sample(range(1, 20), KILLS))
    masters = []
    for i, point in enumerate(points):
        at = point * records // 24
        status = cli.wait_for(
            JOB,
            lambda s: s["records_trained"] >= at
            and s["master"].get("restarts", 0) == i
            and all(replica(s, n)["pid"] for n in ("ps-0",)),
            timeout=300,
            what=f"trained {at} records after {i} master restart(s)",
        )
        before = {r["name"]: r["pid"] for r in status["replicas"] if r["pid"]}
        masters.append(status["master"]["pid"])
        time.sleep(rng.random() * 0.5)  # anywhere between two status writes
        kill(status["master"]["pid"])
        after = cli.wait_for(
            JOB,
            lambda s: s["master"].get("restarts", 0) == i + 1 and replica(s, "ps-0")["pid"],
            timeout=180,
            what=f"restarted master #{i + 1}",
        )
        assert after["master"]["port"] == status["master"]["port"]
        # The PS was adopted, not launched again: same process.
        assert replica(after, "ps-0")["pid"] == before["ps-0"], (before, after["replicas"])
        # Never two processes of one replica.
        dup = {n: p for n, p in _job_processes(job_dir).items() if len(p) > 1}
        assert not dup, dup

    final = cli.wait_end(JOB, timeout=600)
    log = cli.master_log(JOB)
    assert final["phase"] == "Succeeded", log[-4000:]
    assert log.count("starting it again") == KILLS, log[-4000:]
    assert final["records_trained"] == final["records_expected"] == records
    assert final["records_trained_per_epoch"] == {"1": records}
    # Every task counted once: the training tasks plus whole evaluation rounds.
    rounds = len(final["evaluation_history"])
    assert rounds >= 1
    eval_tasks = -(-test_records // TASK_RECORDS)
    train_tasks = -(-records // TASK_RECORDS)
    assert final["tasks_done"] == train_tasks + rounds * eval_tasks, final
    assert final["evaluation_metrics"]["accuracy"] >= 0.65, final["evaluation_metrics"]
    assert replica(final, "ps-0")["restarts"] == 0
    # Nothing left behind: no replica and no master of this job runs.
    deadline = time.monotonic() + 30
    while _job_processes(job_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _job_processes(job_dir)
    for pid in masters:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    accuracy = final["evaluation_metrics"]["accuracy"]
    result = {"kills": KILLS, "tasks_done": final["tasks_done"], "rounds": rounds}
    result["accuracy"] = accuracy
    if README_JOB:
        cli.submit("train", "undisturbed", *_flags(data, steps))
        baseline = cli.wait_end("undisturbed", timeout=900)
        assert baseline["phase"] == "Succeeded", cli.master_log("undisturbed")[-3000:]
        result["undisturbed_accuracy"] = baseline["evaluation_metrics"]["accuracy"]
        assert abs(accuracy - result["undisturbed_accuracy"]) <= 0.01, result
    print(json.dumps(result))


def test_allreduce_job_survives_a_master_kill(cli, small_data):
    """AllReduce: the workers keep their group while the master is away, then regroup through
    the new master's store (its generations are numbered above the dead one's) and finish."""
    job = "allreduce-restart"
    records, test_records = 16384, 4096
    flags = [f for f in _flags(small_data, 40) if not f.startswith("--num_ps_pods")]
    cli.submit("train", job, *flags, "--distribution_strategy=AllreduceStrategy")
    workers = ("worker-0", "worker-1")
    status = cli.wait_for(
        job,
        lambda s: s["records_trained"] >= records // 4
        and all(replica(s, n)["pid"] for n in workers),
        timeout=300,
        what="a quarter of the records trained by both workers",
    )
    before = {n: replica(status, n)["pid"] for n in workers}
    kill(status["master"]["pid"])
    cli.wait_for(
        job, lambda s: s["master"].get("restarts", 0) == 1, timeout=180, what="restarted master"
    )
    final = cli.wait_end(job, timeout=600)
    log = cli.master_log(job)
    assert final["phase"] == "Succeeded", log[-4000:]
    assert status["records_trained"] < records, "the job ended before its master was killed"
    assert final["records_trained"] == final["records_expected"] == records
    rounds = len(final["evaluation_history"])
    train_tasks, eval_tasks = -(-records // TASK_RECORDS), -(-test_records // TASK_RECORDS)
    assert final["tasks_done"] == train_tasks + rounds * eval_tasks, final
    # The same two workers throughout (adopted), regrouped by the second master.
    for name in workers:
        assert replica(final, name)["restarts"] == 0, final["replicas"]
        assert replica(final, name)["pid"] in (before[name], None), (before, final["replicas"])
    assert "Rendezvous: generation 4294967297, world size" in log, log[-4000:]
    assert final["evaluation_metrics"]["accuracy"] >= 0.65, final["evaluation_metrics"]
    deadline = time.monotonic() + 30
    while _job_processes(cli.job_dir(job).resolve()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _job_processes(cli.job_dir(job).resolve())
