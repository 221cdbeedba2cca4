"""Choosing Keras 2 for a model file, and the environment layered over the runtime."""
import json
import os
import sys

import pytest
from elasticdl.common import runtime_env
from elasticdl.common.model_utils import ModelSpecError, load_model_spec


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.delenv(runtime_env.LEGACY_KERAS_ENV, raising=False)
    monkeypatch.setenv(runtime_env.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "path", list(sys.path))


def _model_dir(tmp_path, **files):
    d = tmp_path / "zoo" / "m"
    d.mkdir(parents=True)
    for name, text in files.items():
        (d / f"{name}.py").write_text(text)
    return d


@pytest.mark.parametrize(
    "text",
    [
        "x = tf.keras.layers.DenseFeatures(columns)",
        "c = tf.feature_column.numeric_column('age')",
        "from tensorflow.python.keras.metrics import accuracy",
        "import tf_keras",
        "from elasticdl.python.elasticdl.feature_column import feature_column",
        "import tensorflow.keras.backend as K",
        "s = tf.keras.backend.sum(x, axis=1)",
    ],
)
def test_keras2_apis_are_detected(tmp_path, text):
    d = _model_dir(tmp_path, model="import tensorflow as tf\n", helpers=text + "\n")
    assert runtime_env.uses_keras2(str(d / "model.py"))


def test_keras3_model_and_the_job_environment_decide(tmp_path, monkeypatch):
    d = _model_dir(tmp_path, model="x = tf.keras.layers.Dense(1)  # DenseFeaturesX\n")
    assert not runtime_env.uses_keras2(str(d / "model.py"))
    monkeypatch.setenv(runtime_env.LEGACY_KERAS_ENV, "1")  # --envs=TF_USE_LEGACY_KERAS=1
    assert runtime_env.uses_keras2(str(d / "model.py"))
    d2 = _model_dir(tmp_path / "b", model="tf.keras.layers.DenseFeatures\n")
    monkeypatch.setenv(runtime_env.LEGACY_KERAS_ENV, "0")
    assert not runtime_env.uses_keras2(str(d2 / "model.py"))


def test_tf_keras_matches_the_tensorflow_minor_version():
    major, minor = runtime_env.tensorflow_version().split(".")[:2]
    assert runtime_env.tf_keras_requirement() == f"tf-keras~={major}.{minor}.0"


def test_nothing_needed_is_nothing_installed(tmp_path):
    (tmp_path / "requirements.txt").write_text("# only a comment\n\n")
    assert runtime_env.ensure(str(tmp_path), keras2=False) is None
    assert not (tmp_path / "cache").exists()


def test_what_the_runtime_has_is_not_installed_again(tmp_path):
    # numpy and tensorflow (the runtime's tensorflow-cpu) are satisfied: an empty layer,
    # recorded once, reused without pip.
    (tmp_path / "requirements.txt").write_text("numpy\ntensorflow>=2\n")
    env_dir = runtime_env.ensure(str(tmp_path), keras2=False)
    record = json.loads(open(os.path.join(env_dir, "environment.json")).read())
    assert record["installed"] == [] and record["requirements"] == ["numpy", "tensorflow>=2"]
    assert env_dir in sys.path and sys.path.index(env_dir) == len(sys.path) - 1
    assert runtime_env.ensure(str(tmp_path), keras2=False) == env_dir


def test_a_bad_requirement_is_one_line_before_the_model_loads(tmp_path):
    zoo = tmp_path / "zoo"
    _model_dir(tmp_path, model="def custom_model():\n    pass\n")
    (zoo / "requirements.txt").write_text("not a valid requirement !!\n")
    with pytest.raises(ModelSpecError) as e:
        load_model_spec(str(zoo), "m.model.custom_model")
    msg = str(e.value)
    assert "requirements.txt" in msg and "ERROR" in msg and "\n" not in msg
    assert not any(p.endswith(".partial") for p in os.listdir(tmp_path / "cache" / "envs"))


def test_an_unwritable_cache_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "requirements.txt").write_text("numpy\n")
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(runtime_env.CACHE_ENV, str(blocker))  # a file, not a directory
    with pytest.raises(runtime_env.RuntimeEnvError, match="set ELASTICDL_CACHE_DIR") as e:
        runtime_env.ensure(str(tmp_path), keras2=False)
    assert "\n" not in str(e.value)
