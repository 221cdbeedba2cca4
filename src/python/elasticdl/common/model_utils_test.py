import textwrap

import keras
import pytest
from elasticdl.common.model_utils import (
    Mode,
    ModelSpecError,
    UnsupportedOptimizerError,
    get_dict_from_params_str,
    get_module_file_path,
    get_optimizer_info,
    load_model_spec,
)

_MODEL = """
def custom_model():
    return "model"

def loss(labels, predictions):
    return 0.0

def optimizer(lr=0.1):
    return None

def feed(dataset, mode, metadata):
    return dataset

def eval_metrics_fn():
    return {}
"""


def _write_zoo(tmp_path, pkg, body):
    d = tmp_path / pkg
    d.mkdir()
    (d / "__init__.py").write_text("")
    (d / "model_a.py").write_text(textwrap.dedent(body))
    return str(tmp_path)


def test_load_model_spec_finds_functions(tmp_path):
    zoo = _write_zoo(tmp_path, "zoo_ok", _MODEL + "\nclass PredictionOutputsProcessor: pass\n")
    spec = load_model_spec(zoo, "zoo_ok.model_a.custom_model")
    assert spec.build_model() == "model"
    assert spec.custom_model() == "model"
    assert spec.loss(None, None) == 0.0
    assert spec.callbacks is None
    assert spec.custom_data_reader is None
    assert spec.prediction_outputs_processor.__name__ == "PredictionOutputsProcessor"
    assert spec.model_file.endswith("zoo_ok/model_a.py")


def test_missing_required_function_names_it_and_the_file(tmp_path):
    zoo = _write_zoo(tmp_path, "zoo_noloss", _MODEL.replace("def loss", "def not_loss"))
    with pytest.raises(ModelSpecError) as e:
        load_model_spec(zoo, "zoo_noloss.model_a.custom_model")
    msg = str(e.value)
    assert "'loss'" in msg and "model_a.py" in msg and "\n" not in msg


def test_overridden_names_and_missing_model(tmp_path):
    zoo = _write_zoo(tmp_path, "zoo_names", _MODEL.replace("def feed", "def my_feed"))
    spec = load_model_spec(zoo, "zoo_names.model_a.custom_model", feed="my_feed")
    assert spec.feed(1, Mode.TRAINING, None) == 1
    with pytest.raises(ModelSpecError, match="'other_model'"):
        load_model_spec(zoo, "zoo_names.model_a.other_model", feed="my_feed")


def test_bad_model_def_and_file(tmp_path):
    with pytest.raises(ModelSpecError, match="package.module"):
        get_module_file_path(str(tmp_path), "custom_model")
    with pytest.raises(ModelSpecError, match="does not exist"):
        load_model_spec(str(tmp_path), "nope.model.custom_model")
    assert get_module_file_path("/z", "a.b.f") == "/z/a/b.py"


def test_mode_is_a_string():
    assert Mode.TRAINING == "training"
    assert f"{Mode.PREDICTION}" == "prediction"


def test_params_str():
    d = get_dict_from_params_str('reader_type=RecordIO; columns=["a", "b"]; n=3;')
    assert d == {"reader_type": "RecordIO", "columns": ["a", "b"], "n": 3}
    assert get_dict_from_params_str("") == {}
    with pytest.raises(ValueError):
        get_dict_from_params_str("novalue")


def test_get_optimizer_info():
    assert get_optimizer_info(keras.optimizers.SGD(0.1)) == ("SGD", "learning_rate=0.1;")
    assert get_optimizer_info(keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True)) == (
        "Momentum",
        "learning_rate=0.1;momentum=0.9;nesterov=true;",
    )
    assert get_optimizer_info(keras.optimizers.Adam(0.001, amsgrad=True)) == (
        "Adam",
        "learning_rate=0.001;beta_1=0.9;beta_2=0.999;epsilon=0.0000001;amsgrad=true;",
    )
    assert get_optimizer_info(keras.optimizers.Adagrad(0.05)) == (
        "Adagrad",
        "learning_rate=0.05;epsilon=0.0000001;",
    )
    with pytest.raises(UnsupportedOptimizerError, match="SGD, Adam, Adagrad"):
        get_optimizer_info(keras.optimizers.RMSprop())
