"""The MNIST model-zoo entries train, evaluate and export through a real master, PS and worker."""
import numpy as np
import pytest
import tensorflow as tf
from elasticdl.data.example_codec import encode_example
from elasticdl_testing.local_job import run_local_job, write_recordio

MODEL_ZOO = __file__.rsplit("/mnist/", 1)[0]


def _records(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        label = int(rng.integers(0, 10))
        # Learnable synthetic images: the label sets the brightness of one image row band.
        image = rng.integers(0, 40, size=(28, 28), dtype=np.uint8)
        image[label * 2 : label * 2 + 3, :] = 250
        out.append(encode_example({"image": [image.tobytes()], "label": [label]}))
    return out


@pytest.mark.parametrize(
    "model_def",
    [
        "mnist.mnist_functional_api.custom_model",
        "mnist.mnist_subclass.CustomModel",
    ],
)
def test_mnist_job_trains_evaluates_and_exports(tmp_path, model_def):
    train = write_recordio(str(tmp_path / "train" / "data-0.rio"), _records(128, 0))
    test = write_recordio(str(tmp_path / "test" / "data-0.rio"), _records(32, 1))
    sm = str(tmp_path / "saved_model")
    result = run_local_job(
        MODEL_ZOO,
        model_def,
        training_data=train,
        validation_data=test,
        saved_model_path=sm,
        minibatch_size=16,
        num_epochs=2,
        log_loss_steps=4,
    )
    assert result.exit_code == 0
    summary = result.task_summary
    assert summary.records_trained == 256 and summary.finished
    assert min(result.ps_versions) == 16  # 2 epochs x 8 minibatches, every PS advanced
    metrics = result.evaluation.metrics
    assert 0.0 <= metrics["accuracy"] <= 1.0
    loaded = tf.saved_model.load(sm)
    out = loaded.serve(tf.zeros([2, 28, 28], tf.float32))
    assert out.shape == (2, 10)


def test_the_feed_runs_batched_in_the_worker_with_the_per_record_values(tmp_path):
    """The README model's feed (parse, decode_raw, /255; a shuffle in training) runs on whole
    chunks of records in every mode, the values those of the feed record by record."""
    from elasticdl.common.model_utils import Mode, load_model_spec
    from elasticdl.proto import elasticdl_pb2 as pb
    from elasticdl.worker.task_data_service import TaskDataService

    path = write_recordio(str(tmp_path / "train.rio"), _records(300, 3))
    spec = load_model_spec(MODEL_ZOO, "mnist.mnist_functional_api.custom_model")
    for mode in (Mode.EVALUATION, Mode.PREDICTION, Mode.TRAINING):
        batched, per_record = TaskDataService(spec, 16), TaskDataService(spec, 16)
        key = per_record._pipeline_key(path, mode)
        per_record._batched_feed[key] = False
        for start, end in ((0, 100), (100, 300)):
            shard = pb.Shard(name=path, start=start, end=end)
            got = _rows(batched.dataset(shard, mode))
            want = _rows(per_record.dataset(shard, mode))
            if mode == Mode.TRAINING:  # shuffled: the same rows in another order
                got, want = sorted(got), sorted(want)
            assert got == want and len(got) == end - start
        assert batched._batched_feed == {key: True}, mode


def _rows(minibatches):
    rows = []
    for batch in minibatches:
        images = batch[0] if isinstance(batch, tuple) else batch
        labels = (
            batch[1].numpy().ravel().tolist() if isinstance(batch, tuple) else [0] * len(images)
        )
        rows.extend((images[i].numpy().tobytes(), labels[i]) for i in range(len(images)))
    return rows
