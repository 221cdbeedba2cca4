"""An AllReduce job end to end: the master (local platform) runs two real worker processes that
train the MNIST CNN of the model zoo on a subset of real Fashion-MNIST through torch Gloo
allreduce. Worker 0 is SIGKILLed mid-job: the survivor goes on alone (world size 1), the
relaunched worker joins again (world size 2), no task is lost and the model learns."""
import json
from pathlib import Path

import elasticdl.worker.main  # noqa: F401  (run by the worker processes; tells the build)
import pytest
from elasticdl.common.job_spec import JobSpec
from elasticdl.data.datasets import prepare
from elasticdl.data.datasets.errors import DatasetError
from elasticdl.master.job import Job
from elasticdl_testing.worker_kill import run_killing_worker

MODEL_ZOO = str(Path(__file__).resolve().parents[4] / "model_zoo")


@pytest.fixture(scope="module")
def fashion_mnist(tmp_path_factory):
    out = tmp_path_factory.mktemp("fashion_mnist")
    try:
        return prepare(
            "fashion_mnist", str(out), progress=False, limit=4096, records_per_shard=1024
        )
    except DatasetError as e:  # no network and no cached copy of the Debian package
        pytest.skip(f"Fashion-MNIST unavailable: {e}")


# Enough records that the survivor is still training when the relaunched worker reaches the
# rendezvous: that worker's start (a process, TensorFlow, the rendezvous) takes seconds under
# the test tiers' load.
EPOCHS = 12


def test_allreduce_job_survives_worker_kill_and_regroups(tmp_path, fashion_mnist):
    data = fashion_mnist.output_dir
    spec, _ = JobSpec(
        job_name="allreduce-e2e",
        model_zoo=MODEL_ZOO,
        model_def="mnist.mnist_functional_api.custom_model",
        training_data=f"{data}/train",
        validation_data=f"{data}/test",
        minibatch_size=64,
        num_minibatches_per_task=2,
        num_epochs=EPOCHS,
        num_workers=2,
        evaluation_steps=0,
        distribution_strategy="AllreduceStrategy",
        platform="local",
        job_dir=str(tmp_path / "job"),
        log_level="INFO",
    ).resolve()
    job = Job(spec)

    def both_train():
        history = job.rendezvous.history
        return job.tm.summary().tasks_done >= 4 and history and len(history[-1][1]) == 2

    # Once both workers train together, SIGKILL worker 0 (like a preempted pod).
    code, killed = run_killing_worker(job, both_train, 600)
    status = json.loads((tmp_path / "job" / "status.json").read_text())
    history = job.rendezvous.history
    assert code == 0, (status["message"], history)
    assert killed is not None, "worker 0 was never killed"
    # Exactly-once accounting despite the kill.
    assert status["records_trained"] == status["records_expected"] == EPOCHS * 4096
    replicas = {r["name"]: r for r in status["replicas"]}
    assert replicas["worker-0"]["exit_code"] == 137
    assert replicas["worker-0"]["replaced_by"] == 2
    # Membership: both; then, without worker 0, the survivor (alone, or already with the
    # relaunched worker 2 when both changes reached the rendezvous before the survivor answered
    # the old generation: they form one new generation); later worker 2 is a member.
    worlds = [members for _, members in history]
    both = worlds.index(next(m for m in worlds if sorted(m) == [0, 1]))
    after = worlds[both + 1 :]
    assert after and all(0 not in m for m in after), history
    assert sorted(after[0]) in ([1], [1, 2]), history
    assert any(2 in m for m in after), history
    # Generations are consecutive.
    assert [g for g, _ in history] == list(range(1, len(history) + 1))
    accuracy = status["evaluation_metrics"]["accuracy"]
    assert accuracy > 0.6, status["evaluation_metrics"]
