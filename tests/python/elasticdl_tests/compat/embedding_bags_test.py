"""The PS-backed Embedding fed SparseTensor bags of ids (the original ElasticDL's sparse
inputs, with its `combiner`) in a short local PS job on real Fashion-MNIST records in the
original generators' schema: each image becomes the bag of its bright pixels' positions. The
job must evaluate well above chance (10%), and the model it exports to --output (the table
pulled from the PS) must take a SparseTensor and predict as well."""
import json
from pathlib import Path

import elasticdl.worker.main  # noqa: F401  (run by the worker processes; tells the build)
import numpy as np
import pytest
import tensorflow as tf
from elasticdl.common.job_spec import spec_from_text
from elasticdl.data import recordio
from elasticdl.data.example_codec import decode_example_values
from elasticdl.master.job import Job
from elasticdl_tests.compat.original_data import prepare_original_fashion_mnist

ZOO = Path(__file__).resolve().parent / "testdata" / "model_zoo"
RECORDS = 2048


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepare_original_fashion_mnist(
        tmp_path_factory.mktemp("fashion_mnist_original"), RECORDS
    )


def test_sparse_bags_of_ids_train_with_a_ps_and_export(tmp_path, data):
    values = {
        "job_name": "bags",
        "model_zoo": str(ZOO),
        "model_def": "fashion_bag.fashion_bag_of_pixels.custom_model",
        "model_params": "combiner='sum'",
        "training_data": f"{data.output_dir}/train",
        "validation_data": f"{data.output_dir}/test",
        "minibatch_size": "64",
        "num_minibatches_per_task": "4",
        "num_epochs": "2",
        "num_workers": "1",
        "platform": "local",
        "output": str(tmp_path / "exported"),
        "job_dir": str(tmp_path / "job"),
    }
    spec, _ = spec_from_text("train", values).resolve()
    code = Job(spec).run()
    status = json.loads((tmp_path / "job" / "status.json").read_text())
    assert code == 0, status["message"]
    print("bags of pixels", status["evaluation_metrics"])
    assert status["records_trained"] == 2 * RECORDS
    assert status["evaluation_metrics"]["accuracy"] > 0.5, status["evaluation_metrics"]

    # The exported model: the whole table in the layer, a SparseTensor signature. The test
    # split's bags, built here as the model file's feed builds them (bright: > 127).
    images, labels = [], []
    for path in data.files["test"]:
        for record in recordio.Scanner(path):
            example = decode_example_values(record)
            images.append(np.asarray(example["image"], np.float32))
            labels.append(int(example["label"][0]))
    rows, ids = np.nonzero(np.stack(images) > 127.0)
    counts = np.bincount(rows, minlength=len(images))
    positions = np.concatenate([np.arange(c) for c in counts])
    batch = tf.SparseTensor(
        np.stack([rows, positions], axis=1), ids.astype(np.int64), [len(images), 784]
    )
    loaded = tf.saved_model.load(str(tmp_path / "exported"))
    logits = loaded.serve({"pixels": batch}).numpy()
    accuracy = float(np.mean(logits.argmax(axis=1) == np.asarray(labels)))
    print("exported bags of pixels", accuracy)
    assert accuracy > 0.5
