"""A BatchNormalization model's moving statistics reach the PS checkpoint, and an `evaluate` job
from that checkpoint scores what the training job's final evaluation scored. Before the PS kept
non-trainable state, the evaluate job ran with the initial statistics (mean 0, variance 1).

Short local jobs (master in this process, PS and worker as processes) of the original-style
model file testdata/model_zoo/mnist/mnist_functional_api.py on real Fashion-MNIST records."""

import elasticdl.worker.main  # noqa: F401  (run by the worker processes; tells the build)
import numpy as np
import pytest
from elasticdl.common import tensor_utils as tu
from elasticdl.ps import checkpoint
from elasticdl_tests.compat.local_jobs import run_local_job
from elasticdl_tests.compat.original_data import prepare_original_fashion_mnist

MODEL_DEF = "mnist.mnist_functional_api.custom_model"
RECORDS = 2048  # 32 minibatches of 64: checkpoints at versions 8, 16, 24 and 32 (the last)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepare_original_fashion_mnist(
        tmp_path_factory.mktemp("fashion_mnist_original"), RECORDS
    )


def _run(kind, tmp_path, name, **flags):
    return run_local_job(kind, tmp_path, name, model_def=MODEL_DEF, **flags)


def test_evaluate_job_from_checkpoint_uses_the_trained_batchnorm_statistics(tmp_path, data):
    trained = _run(
        "train",
        tmp_path,
        "train",
        training_data=f"{data.output_dir}/train",
        validation_data=f"{data.output_dir}/test",
        num_minibatches_per_task="4",
        num_epochs="1",
        checkpoint_dir=str(tmp_path / "ckpt"),
        checkpoint_steps="8",
    )
    newest = checkpoint.get_latest_valid_version_dir(str(tmp_path / "ckpt"))
    assert newest is not None and newest.endswith("version-32"), newest
    state = checkpoint.restore(newest, 0, 1).state
    means = [tu.pb_to_ndarray(t) for n, t in state.items() if n.endswith("moving_mean")]
    variances = [tu.pb_to_ndarray(t) for n, t in state.items() if n.endswith("moving_variance")]
    assert len(means) == len(variances) == 1, sorted(state)
    assert np.abs(means[0]).max() > 0.01  # trained away from the initial zeros
    assert np.abs(variances[0] - 1.0).max() > 0.01  # ... and ones

    evaluated = _run(
        "evaluate",
        tmp_path,
        "evaluate",
        validation_data=f"{data.output_dir}/test",
        checkpoint_dir_for_init=newest,
    )
    train_acc = trained["evaluation_metrics"]["accuracy"]
    eval_acc = evaluated["evaluation_metrics"]["accuracy"]
    print("final evaluation of the training job", train_acc, "evaluate job", eval_acc)
    assert train_acc > 0.3, trained["evaluation_metrics"]  # it learned something
    assert abs(eval_acc - train_acc) <= 0.01, (train_acc, eval_acc)
