"""The original ElasticDL's SavedModelExporter callback and --output (PS and AllReduce), and a
model file's PredictionOutputsProcessor writing a CSV, by short local jobs on real
Fashion-MNIST records in the original generators' schema. The exported directory is loaded
with `tf.saved_model.load` and must predict the test split well above chance (10%)."""

import elasticdl.worker.main  # noqa: F401  (run by the worker processes; tells the build)
import numpy as np
import pytest
import tensorflow as tf
from elasticdl.data import recordio
from elasticdl.data.example_codec import decode_example_values
from elasticdl_tests.compat.local_jobs import run_local_job
from elasticdl_tests.compat.original_data import prepare_original_fashion_mnist

MODEL_DEF = "mnist.mnist_dnn_export.custom_model"
RECORDS = 2048


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepare_original_fashion_mnist(
        tmp_path_factory.mktemp("fashion_mnist_original"), RECORDS
    )


@pytest.fixture(scope="module")
def test_split(data):
    images, labels = [], []
    for path in data.files["test"]:
        for record in recordio.Scanner(path):
            values = decode_example_values(record)
            images.append(np.asarray(values["image"], np.float32).reshape(28, 28) / 255.0)
            labels.append(int(values["label"][0]))
    return np.stack(images), np.asarray(labels)


def _run(kind, tmp_path, name, **flags):
    return run_local_job(kind, tmp_path, name, model_def=MODEL_DEF, **flags)


def _train(tmp_path, data, **flags):
    return _run(
        "train",
        tmp_path,
        "export",
        training_data=f"{data.output_dir}/train",
        num_minibatches_per_task="4",
        num_epochs="2",
        output=str(tmp_path / "exported"),
        **flags,
    )


def _exported_accuracy(path, test_split):
    images, labels = test_split
    loaded = tf.saved_model.load(str(path))  # kept: its functions reference its variables
    served = loaded.serve({"image": tf.constant(images)})
    return float(np.mean(np.argmax(served.numpy(), axis=1) == labels))


def _export_logs(job_dir):
    return [
        line
        for log in sorted((job_dir / "logs").glob("worker-*.log"))
        for line in log.read_text().splitlines()
        if "Exported SavedModel" in line
    ]


def test_saved_model_exporter_with_a_ps_and_a_processor_writing_csv(tmp_path, data, test_split):
    # callbacks() returns [SavedModelExporter()]: the model is exported once, to --output.
    _train(tmp_path, data, checkpoint_steps="16", checkpoint_dir=str(tmp_path / "ckpt"))
    assert len(_export_logs(tmp_path / "export")) == 1
    accuracy = _exported_accuracy(tmp_path / "exported", test_split)
    print("exported (PS)", accuracy)
    assert accuracy > 0.6

    # A prediction job from the last checkpoint: the model file's processor gets the outputs
    # as tensors (it calls predictions.numpy()) and writes one CSV row per record.
    versions = sorted((tmp_path / "ckpt").glob("version-*"), key=lambda p: int(p.name[8:]))
    assert versions, "no checkpoint written"
    out = tmp_path / "outputs"
    out.mkdir()
    _run(
        "predict",
        tmp_path,
        "predict",
        prediction_data=f"{data.output_dir}/test",
        checkpoint_dir_for_init=str(versions[-1]),
        envs=f"PREDICTION_OUTPUTS_DIR={out}",
    )
    assert [p.name for p in out.iterdir()] == ["worker-0.csv"]
    rows = np.loadtxt(out / "worker-0.csv", delimiter=",")
    images, labels = test_split
    assert rows.shape == (len(labels), 10)  # every record once (one worker: in order)
    np.testing.assert_allclose(rows.sum(axis=1), 1.0, atol=1e-4)  # softmax rows
    accuracy = float(np.mean(rows.argmax(axis=1) == labels))
    print("predicted by the processor", accuracy)
    assert accuracy > 0.6


def test_allreduce_job_exports_to_output(tmp_path, data, test_split):
    _train(tmp_path, data, distribution_strategy="AllreduceStrategy", num_workers="2")
    assert len(_export_logs(tmp_path / "export")) == 1
    accuracy = _exported_accuracy(tmp_path / "exported", test_split)
    print("exported (AllReduce)", accuracy)
    assert accuracy > 0.6
