"""Wide & Deep on census-shaped records trains, evaluates and exports end to end."""
import numpy as np
import tensorflow as tf
from elasticdl.data.example_codec import encode_example
from elasticdl_testing.local_job import run_local_job, write_recordio

MODEL_ZOO = __file__.rsplit("/census_wide_deep/", 1)[0]


def _records(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        age = float(rng.integers(18, 80))
        out.append(
            encode_example(
                {
                    "age": [age],
                    "workclass": [b"Private"],
                    "fnlwgt": [float(rng.integers(1e4, 1e6))],
                    "education": [b"Bachelors"],
                    "educational_num": [13.0],
                    "marital_status": [b"Never-married"],
                    "occupation": [b"Sales"],
                    "relationship": [b"Husband"],
                    "race": [b"White"],
                    "gender": [b"Male"],
                    "capital_gain": [0.0],
                    "capital_loss": [0.0],
                    "hours_per_week": [40.0],
                    "native_country": [b"United-States"],
                    "label": [int(age > 45)],
                }
            )
        )
    return out


def test_wide_deep_job(tmp_path):
    train = write_recordio(str(tmp_path / "train.rio"), _records(64, 0))
    test = write_recordio(str(tmp_path / "test.rio"), _records(32, 1))
    sm = str(tmp_path / "sm")
    result = run_local_job(
        MODEL_ZOO,
        "census_wide_deep.wide_deep_functional_api.custom_model",
        training_data=train,
        validation_data=test,
        saved_model_path=sm,
    )
    assert result.exit_code == 0
    assert result.task_summary.records_trained == 64
    assert 0.0 <= result.evaluation.metrics["accuracy"] <= 1.0
    assert tf.saved_model.load(sm) is not None
