"""Worker loop against the real master servicer and PS (in-process, real gRPC)."""
import textwrap

import numpy as np
from elasticdl.data.example_codec import encode_example
from elasticdl.worker.main import main
from elasticdl.worker.testing import run_local_job, write_recordio

_MODEL = """
import keras
import tensorflow as tf
from elasticdl.worker.callbacks import LearningRateScheduler, MaxStepsStopping

SEEN_LR = []

def custom_model():
    inp = keras.Input(shape=(2,), name="x")
    return keras.Model(inp, keras.layers.Dense(1, name="out")(inp))

def loss(labels, predictions):
    return tf.reduce_mean(tf.square(tf.cast(labels, tf.float32) - tf.reshape(predictions, [-1])))

def optimizer(lr=0.05):
    return keras.optimizers.SGD(lr)

def _parse(r):
    ex = tf.io.parse_single_example(r, {"x": tf.io.FixedLenFeature([2], tf.float32),
                                       "y": tf.io.FixedLenFeature([], tf.float32)})
    return ex["x"], ex["y"]

def feed(dataset, mode, metadata):
    return dataset.map(_parse)

def eval_metrics_fn():
    return {"mse": lambda labels, predictions: (labels - predictions.reshape(-1)) ** 2}

def _schedule(version):
    SEEN_LR.append(version)
    return 0.05 if version < 3 else 0.01

def callbacks():
    return [LearningRateScheduler(_schedule), MaxStepsStopping(5)]
"""


def _data(path, n):
    rng = np.random.default_rng(0)
    recs = []
    for _ in range(n):
        x = rng.normal(size=2).astype(np.float32)
        recs.append(encode_example({"x": x.tolist(), "y": [float(2 * x[0] - x[1])]}))
    return write_recordio(path, recs)


def test_worker_loop_callbacks_max_steps_and_export(tmp_path):
    zoo = tmp_path / "zoo"
    (zoo / "lin").mkdir(parents=True)
    (zoo / "lin" / "__init__.py").write_text("")
    (zoo / "lin" / "model.py").write_text(textwrap.dedent(_MODEL))
    train = _data(str(tmp_path / "train.rio"), 160)
    test = _data(str(tmp_path / "test.rio"), 32)
    result = run_local_job(
        str(zoo),
        "lin.model.custom_model",
        training_data=train,
        validation_data=test,
        saved_model_path=str(tmp_path / "sm"),
        minibatch_size=8,
        num_minibatches_per_task=2,
        num_ps=1,
    )
    assert result.exit_code == 0
    # MaxStepsStopping(5): training stops at version 5; later tasks are acknowledged untrained.
    assert result.ps_versions == [5]
    assert result.worker.trainer.steps == 5
    assert result.task_summary.finished
    # The schedule was consulted with the PS version before each step, and its lr is in use.
    import lin.model as m

    assert m.SEEN_LR[:5] == [0, 1, 2, 3, 4]
    assert result.worker.trainer.learning_rate == np.float32(0.01)
    assert "mse" in result.evaluation.metrics
    assert (tmp_path / "sm" / "saved_model.pb").exists()


def test_main_rejects_bad_flags_with_exit_2(tmp_path, capsys):
    code = main(
        [
            "--worker_id",
            "0",
            "--master_addr",
            "127.0.0.1:1",
            "--ps_addrs",
            "",
            "--job_type",
            "training_only",
            "--model_zoo",
            str(tmp_path),
            "--model_def",
            "a.b.custom_model",
        ]
    )
    assert code == 2
    assert "--ps_addrs" in capsys.readouterr().err
