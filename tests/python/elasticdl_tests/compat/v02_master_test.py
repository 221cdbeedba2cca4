"""The original ElasticDL's master-side v0.2 features in one short real local job, submitted
through the `elasticdl` CLI (client -> master -> PS and worker processes on 127.0.0.1) on real
Fashion-MNIST records:

* ``--tensorboard_log_dir``: event files TensorBoard's own reader finds the training loss and
  the evaluation accuracy in;
* ``--evaluation_start_delay_secs`` / ``--evaluation_throttle_secs`` (``--evaluation_steps=0``):
  time-based evaluation rounds, none before the delay, none closer than the throttle;
* the tutorial's log lines: ``Evaluation service started`` / ``stopped`` in the master's log,
  ``Loss = <value>, steps = <n>`` in the worker's (read with ``elasticdl logs``).
"""
from __future__ import annotations

import datetime
import os
import re
from pathlib import Path

import pytest
from elasticdl_tests.e2e.conftest import Cli, data_cache

pytest.importorskip("tensorflow")
pytest.importorskip("tensorboard")

JOB = "v02-master"
DELAY_S = 2
THROTTLE_S = 2
# Training must outlast the delay and a few throttles even on a quiet machine, where an epoch of
# 2048 records takes ~1.4 s and the worker ~3 s to start: 2 epochs once gave no timed round.
EPOCHS = 4
# "[2026-01-01 12:00:00,123] [INFO] [file.py:1:fn] message"
_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def _subset(source: Path, directory: Path, records: int) -> str:
    """The first ``records`` records of one shard of ``source``, as one RecordIO file."""
    from elasticdl.data.recordio import Scanner, Writer

    directory.mkdir(parents=True)
    name = sorted(n for n in os.listdir(source) if not n.startswith("."))[0]
    scanner = Scanner(str(source / name), 0, records)
    with Writer(str(directory / name)) as w:
        record = scanner.record()
        while record is not None:
            w.write(record)
            record = scanner.record()
    scanner.close()
    return str(directory)


def _times(log: str, message: str) -> list[datetime.datetime]:
    times = []
    for line in log.splitlines():
        m = _LOG_TIME.match(line)
        if m and message in line:
            times.append(datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f"))
    return times


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    from elasticdl.data.datasets import prepare

    prepare("fashion_mnist", str(data_cache()), progress=False)
    root = tmp_path_factory.mktemp("v02")
    cli = Cli(root / "home", root)
    tensorboard = root / "tb" / "run1"  # created by the master
    try:
        cli.submit(
            "train",
            JOB,
            f"--training_data={_subset(data_cache() / 'train', root / 'train', 2048)}",
            f"--validation_data={_subset(data_cache() / 'test', root / 'test', 256)}",
            f"--num_epochs={EPOCHS}",
            "--minibatch_size=16",
            "--num_minibatches_per_task=8",
            "--num_workers=1",
            "--num_ps_pods=1",
            "--evaluation_steps=0",
            f"--evaluation_start_delay_secs={DELAY_S}",
            f"--evaluation_throttle_secs={THROTTLE_S}",
            f"--tensorboard_log_dir={tensorboard}",
            "--log_loss_steps=10",
        )
        status = cli.wait_end(JOB, timeout=400)
        yield cli, status, tensorboard
    finally:
        cli.cleanup()


def test_tensorboard_event_files_hold_loss_and_accuracy(job):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cli, status, tensorboard = job
    assert status["phase"] == "Succeeded", cli.master_log(JOB)[-3000:]
    events = EventAccumulator(str(tensorboard))
    events.Reload()
    assert {"loss", "accuracy"} <= set(events.Tags()["scalars"]), events.Tags()
    loss = events.Scalars("loss")
    # One mean loss per training task: EPOCHS x 2048 records / 128 per task.
    assert len(loss) == EPOCHS * 2048 // 128, len(loss)
    assert all(0 < e.value < 10 for e in loss), [e.value for e in loss]
    first, last = loss[0].value, sum(e.value for e in loss[-8:]) / 8
    assert last < first, (first, last)  # it trained
    accuracy = events.Scalars("accuracy")
    rounds = status["evaluation_history"]
    assert [e.step for e in accuracy] == [r["model_version"] for r in rounds]
    assert [round(e.value, 5) for e in accuracy] == [
        round(r["metrics"]["accuracy"], 5) for r in rounds
    ]
    assert accuracy[-1].value > 0.5, [e.value for e in accuracy]  # 10 classes: chance is 0.1


def test_time_based_evaluation_honours_delay_and_throttle(job):
    cli, status, _ = job
    log = cli.master_log(JOB)
    started = _times(log, "Evaluation service started")
    rounds = _times(log, "Evaluation of model version")
    timed = [t for t, line in zip(rounds, _round_lines(log)) if "version latest" not in line]
    assert len(started) == 1 and timed, log[-3000:]
    # Several timed rounds while training (and the final one after it), none too early.
    assert len(rounds) == len(timed) + 1 == len(status["evaluation_history"])
    # The lines are logged a little after the checks the scheduler times (a busy machine can
    # delay one line more than the next): a margin well below the 1 s between the master's checks.
    assert (timed[0] - started[0]).total_seconds() >= DELAY_S - 0.25
    gaps = [(b - a).total_seconds() for a, b in zip(timed, timed[1:])]
    assert all(g >= THROTTLE_S - 0.25 for g in gaps), gaps


def _round_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "Evaluation of model version" in line]


def test_the_tutorials_log_lines(job):
    cli, status, _ = job
    master = cli.run("logs", JOB).stdout
    assert "Evaluation service started" in master
    assert "Evaluation service stopped" in master
    assert master.index("Evaluation service stopped") > master.rindex("Evaluation metrics[v=")
    worker = cli.run("logs", JOB, "--replica", "worker-0").stdout
    losses = re.findall(r"Loss = (\S+), steps = (\d+)$", worker, re.MULTILINE)
    assert len(losses) >= 3, worker[-2000:]
    assert all(0 < float(value) < 10 for value, _ in losses), losses
    steps = [int(s) for _, s in losses]
    assert steps == sorted(steps) and steps[-1] >= 250, steps  # every 10 of 256 steps
