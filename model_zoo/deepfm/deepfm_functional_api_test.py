"""DeepFM trains with its embedding tables on two real PS, evaluates, and exports."""
import numpy as np
import tensorflow as tf
from elasticdl.data.example_codec import encode_example
from elasticdl_testing.local_job import run_local_job, write_recordio

MODEL_ZOO = __file__.rsplit("/deepfm/", 1)[0]


def _records(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        user, movie = int(rng.integers(1, 50)), int(rng.integers(1, 80))
        rating = float(rng.integers(1, 6))
        out.append(
            encode_example(
                {
                    "user_id": [user],
                    "movie_id": [movie],
                    "rating": [rating],
                    "label": [int(rating >= 4)],
                }
            )
        )
    return out


def test_deepfm_job_with_ps_embeddings(tmp_path):
    train = write_recordio(str(tmp_path / "train.rio"), _records(96, 0))
    test = write_recordio(str(tmp_path / "test.rio"), _records(32, 1))
    sm = str(tmp_path / "sm")
    result = run_local_job(
        MODEL_ZOO,
        "deepfm.deepfm_functional_api.custom_model",
        training_data=train,
        validation_data=test,
        saved_model_path=sm,
        minibatch_size=16,
    )
    assert result.exit_code == 0
    assert result.task_summary.records_trained == 96
    assert 0.0 <= result.evaluation.metrics["accuracy"] <= 1.0
    trainer = result.worker.trainer
    assert {l.name for l in trainer.embedding_layers} == {
        "user_id_embedding",
        "movie_id_embedding",
        "user_id_bias",
        "movie_id_bias",
    }
    loaded = tf.saved_model.load(sm)
    out = loaded.serve(
        {"user_id": tf.constant([[3]], tf.int64), "movie_id": tf.constant([[5]], tf.int64)}
    )
    assert out.shape == (1, 1)
