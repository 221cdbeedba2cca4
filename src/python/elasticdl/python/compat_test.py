"""The original ElasticDL's import paths give this project's own classes."""
import importlib

import pytest


@pytest.mark.parametrize(
    "old, name, new",
    [
        ("elasticdl.python.common.constants", "Mode", "elasticdl.common.model_utils"),
        ("elasticdl.python.common.constants", "JobType", "elasticdl.common.types"),
        (
            "elasticdl.python.elasticdl.callbacks",
            "LearningRateScheduler",
            "elasticdl.worker.callbacks",
        ),
        ("elasticdl.python.elasticdl.callbacks", "MaxStepsStopping", "elasticdl.worker.callbacks"),
        (
            "elasticdl.python.elasticdl.callbacks",
            "SavedModelExporter",
            "elasticdl.worker.callbacks",
        ),
        (
            "elasticdl.python.elasticdl.callbacks.saved_model_exporter",
            "SavedModelExporter",
            "elasticdl.worker.callbacks",
        ),
        (
            "elasticdl.python.elasticdl.callbacks.max_steps_stopping",
            "MaxStepsStopping",
            "elasticdl.worker.callbacks",
        ),
        ("elasticdl.python.elasticdl.layers.embedding", "Embedding", "elasticdl.worker.layers"),
        (
            "elasticdl.python.worker.prediction_outputs_processor",
            "BasePredictionOutputsProcessor",
            "elasticdl.worker.callbacks",
        ),
    ],
)
def test_original_paths_are_the_project_classes(old, name, new):
    assert getattr(importlib.import_module(old), name) is getattr(
        importlib.import_module(new), name
    )


def test_constants_and_logger():
    from elasticdl.python.common.constants import DistributionStrategy, MaxComputeConfig, Mode
    from elasticdl.python.common.log_utils import default_logger

    assert Mode.TRAINING == "training" and Mode.PREDICTION == "prediction"
    assert DistributionStrategy.ALLREDUCE == "AllreduceStrategy"
    assert MaxComputeConfig.PROJECT_NAME == "MAXCOMPUTE_PROJECT"
    default_logger.info("the original's default_logger logs")


def test_odps_is_not_configured_and_a_writer_says_why(monkeypatch):
    from elasticdl.python.data.odps_io import ODPSWriter, is_odps_configured

    for name in ("MAXCOMPUTE_PROJECT", "MAXCOMPUTE_AK", "MAXCOMPUTE_SK"):
        monkeypatch.delenv(name, raising=False)
    assert not is_odps_configured()
    with pytest.raises(NotImplementedError, match="not supported"):
        ODPSWriter("p", "a", "k", "e", "table")


def test_embedding_column_is_tensorflows():
    import tensorflow as tf
    from elasticdl.python.elasticdl.feature_column import feature_column

    column = feature_column.embedding_column(
        tf.feature_column.categorical_column_with_hash_bucket("sex", hash_bucket_size=8),
        dimension=4,
    )
    assert column.dimension == 4 and column.combiner == "mean"
    assert column.categorical_column.key == "sex"
