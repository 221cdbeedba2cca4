"""A journal written by an earlier master still replays.

``testdata/journal_v1/`` is a job directory's ``journal/`` as the master wrote it while its
three state owners still built their records as plain dicts, and ``expected.json`` holds the
state they had when they wrote it. The test replays those files with the current code into
fresh owners of the same job and compares. ``python journal_compat_test.py`` is what wrote the
fixture (on that earlier code): a task manager, an evaluation service and a replica manager of
one job driven through handing out, reports (success, failure, report-and-get), re-queues,
timeouts, evaluation rounds, a snapshot, worker and PS failures, a relaunch and a failed job.
Every kind of record of the three journals is in it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from elasticdl.master.evaluation_service import EvaluationService
from elasticdl.master.replica_manager import ReplicaManager, ReplicaManagerConfig
from elasticdl.master.resume import JobJournal
from elasticdl.master.task_manager import TaskManager, TaskManagerConfig
from elasticdl.platform.base import Platform, ReplicaEvent, ReplicaPhase, ReplicaSpec, ReplicaType

STEPS = 34
SPEC_JSON = '{"job_name": "journal-v1"}'
W, PS = ReplicaType.WORKER, ReplicaType.PS


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ScriptedPlatform(Platform):
    """Replicas are launched in name only; the script ends them with the events a kubelet or
    the OS would report."""

    def __init__(self) -> None:
        super().__init__("scripted")

    @classmethod
    def from_spec(cls, spec):
        return cls()

    def launch(self, spec):
        self._emit(ReplicaEvent(spec.replica_type, spec.replica_id, ReplicaPhase.RUNNING))

    def delete(self, replica_type, replica_id, grace_seconds=10.0):
        pass

    def address(self, replica_type, replica_id):
        return f"{replica_type}-{replica_id}:2222"

    def master_address(self, port):
        return f"master:{port}"

    def replica_identity(self, replica_type, replica_id):
        return {"pid": 4000 + 10 * int(replica_type == PS) + replica_id, "start": 77}

    def shutdown(self, delete_all=True):
        pass

    def end(self, replica_type, replica_id, phase, exit_code, reason=""):
        self._emit(ReplicaEvent(replica_type, replica_id, phase, exit_code, reason))


def build(clock: Clock, platform: Platform):
    tm = TaskManager(
        TaskManagerConfig(
            records_per_task=4,
            num_epochs=2,
            minibatch_size=2,
            shuffle=True,
            seed=7,
            max_task_retries=2,
            saved_model_path="/out",
        ),
        training_shards=[("train-a", 0, 18), ("train-b", 3, 14)],
        evaluation_shards=[("eval", 0, 9)],
        clock=clock,
    )
    es = EvaluationService(tm, lambda: {"mean": _Mean()}, evaluation_steps=5)
    spec = lambda kind: lambda i: ReplicaSpec(  # noqa: E731
        kind, i, module=f"elasticdl.{kind}.main", args=[f"--id={i}"], port=2222
    )
    rm = ReplicaManager(platform, ReplicaManagerConfig(1, 2), spec(W), spec(PS), tm)
    return tm, es, rm


class _Mean:
    def __init__(self):
        self.total, self.count = 0.0, 0

    def update_state(self, labels, predictions):
        self.total += float(sum(labels))
        self.count += len(labels)

    def result(self):
        return self.total / max(self.count, 1)


def expected_state(tm, es, rm) -> dict:
    return {
        "tasks": tm.state(),
        "summary": tm.summary().to_dict(),
        "evaluation": {
            "model_version": es.model_version,
            "history": [[r.model_version, r.metrics, r.failed_tasks] for r in es.history],
        },
        "replicas": sorted(
            [s.to_dict() for s in rm.replicas()], key=lambda d: (d["type"], d["id"])
        ),
        "failed_message": rm.failed_message,
    }


def main(out: str) -> None:
    import numpy as np

    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    clock, platform = Clock(), ScriptedPlatform()
    tm, es, rm = build(clock, platform)
    journal = JobJournal(out, SPEC_JSON, fsync_interval_s=0)
    journal.tasks.compact_every = 4  # one snapshot early on, then records only
    journal.open(50123)
    tm.attach_journal(journal.tasks)
    es.attach_journal(journal.evaluation)
    rm.attach_journal(journal.replicas)
    rm.start()

    held = {0: [], 1: []}
    for step in range(STEPS):
        clock.now += 1.5
        w = step % 2
        if step == 6:
            journal.tasks.compact_every = 0
        if step == 9:
            # Worker 1 dies: its tasks go back, worker 2 replaces it.
            platform.end(W, 1, ReplicaPhase.FAILED, 1, "Error")
            held[1] = []
            w = 0
        if step == 14:
            es.report_version(5)
        if step == 17:
            platform.end(PS, 0, ReplicaPhase.FAILED, 1, "Error")
        if held[w] and step % 3 == 0:
            ok = step != 6
            task_id = held[w].pop(0)
            task = tm.report_and_get(task_id, ok, w, {"batches": 2}, "" if ok else "boom", step)
            if task.task_id:
                held[w].append(task.task_id)
            continue
        if held[w]:
            task_id = held[w].pop(0)
            doing = {v[0][0]: v[0][1] for v in tm.state()["doing"]}
            if doing.get(task_id) == 2:  # an evaluation task: its outputs first
                es.report_evaluation_metrics(
                    {"output": np.ones((2, 1), np.float32)},
                    np.array([step, 1.0], np.float32),
                    w,
                    task_id,
                    model_version=5,
                )
            tm.report(task_id, True, w, {"batches": 2}, "", step)
            continue
        task = tm.get(w)
        if task.task_id:
            held[w].append(task.task_id)
        if step == 20:
            tm.report(1, True, 1)  # stale: worker 1 is gone
        if step == 22:
            clock.now += 5000  # every held task is over the timeout
            tm.check_timeouts()
    # A restarted master drops an open round to run it again; then the job fails.
    tm.drop_evaluation_round(-1)
    rm._fail("no worker left (all ended and none can be relaunched) while tasks remain")
    journal.close()
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected_state(tm, es, rm), f, indent=1, sort_keys=True)
        f.write("\n")


FIXTURE = Path(__file__).parent / "testdata" / "journal_v1"


def test_a_journal_of_the_earlier_format_replays_to_the_state_that_wrote_it(tmp_path):
    job_dir = tmp_path / "job"
    shutil.copytree(FIXTURE, job_dir)
    expected = json.loads((job_dir / "expected.json").read_text())
    previous = JobJournal(job_dir, SPEC_JSON, fsync_interval_s=0).previous()
    assert previous is not None and previous.port == 50123 and previous.lives == 1
    assert previous.tasks[0] is not None  # the snapshot, then records after it
    tm, es, rm = build(Clock(), ScriptedPlatform())
    tm.replay(*previous.tasks)
    es.replay(*previous.evaluation)
    rm.restore(previous.replicas)
    assert json.loads(json.dumps(expected_state(tm, es, rm))) == expected


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(FIXTURE))
