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


# ---- model files written for the original ElasticDL -----------------------------------------


def test_v02_dataset_fn_is_the_feed_when_there_is_no_feed(tmp_path):
    zoo = _write_zoo(tmp_path, "zoo_v02", _MODEL.replace("def feed", "def dataset_fn"))
    spec = load_model_spec(zoo, "zoo_v02.model_a.custom_model")
    assert spec.feed.__name__ == "dataset_fn"
    assert spec.feed("ds", Mode.TRAINING, None) == "ds"
    # --dataset_fn names it explicitly; a different --feed as well is an error.
    renamed = _write_zoo(tmp_path, "zoo_v02b", _MODEL.replace("def feed", "def my_input"))
    spec = load_model_spec(renamed, "zoo_v02b.model_a.custom_model", dataset_fn="my_input")
    assert spec.feed("ds", Mode.TRAINING, None) == "ds"
    with pytest.raises(ModelSpecError, match="--dataset_fn") as e:
        load_model_spec(renamed, "zoo_v02b.model_a.custom_model", feed="x", dataset_fn="my_input")
    assert "\n" not in str(e.value)
    with pytest.raises(ModelSpecError, match="--dataset_fn: 'nope'"):
        load_model_spec(renamed, "zoo_v02b.model_a.custom_model", dataset_fn="nope")


def test_v01_two_argument_dataset_fn_gets_no_metadata(tmp_path):
    body = _MODEL.replace(
        "def feed(dataset, mode, metadata):\n    return dataset",
        "def dataset_fn(dataset, mode):\n    return (dataset, mode)",
    )
    zoo = _write_zoo(tmp_path, "zoo_v01", body)
    spec = load_model_spec(zoo, "zoo_v01.model_a.custom_model")
    assert spec.feed("ds", Mode.EVALUATION, {"columns": []}) == ("ds", Mode.EVALUATION)
    one_argument = body.replace("dataset_fn(dataset, mode):", "dataset_fn(dataset):")
    one_argument = one_argument.replace("return (dataset, mode)", "return dataset")
    (tmp_path / "one").mkdir()
    spec = load_model_spec(
        _write_zoo(tmp_path / "one", "zoo_v01b", one_argument), "zoo_v01b.model_a.custom_model"
    )
    assert spec.feed("ds", Mode.TRAINING, None) == "ds"


def test_model_params_are_keyword_arguments_of_the_model(tmp_path):
    body = _MODEL.replace(
        'def custom_model():\n    return "model"',
        "def custom_model(units=4, name='m', dims=(1,)):\n    return (units, name, dims)",
    )
    zoo = _write_zoo(tmp_path, "zoo_params", body)
    spec = load_model_spec(
        zoo, "zoo_params.model_a.custom_model", model_params="units=16; name=wide; dims=[2, 3]"
    )
    assert spec.build_model() == (16, "wide", [2, 3])
    assert spec.model_fn() == (16, "wide", [2, 3])
    with pytest.raises(ModelSpecError) as e:
        load_model_spec(zoo, "zoo_params.model_a.custom_model", model_params="unit=16")
    msg = str(e.value)
    assert "--model_params" in msg and "'unit'" in msg and "units, name, dims" in msg
    with pytest.raises(ModelSpecError, match="--model_params"):
        load_model_spec(zoo, "zoo_params.model_a.custom_model", model_params="units")


def test_model_params_of_a_model_class(tmp_path):
    body = _MODEL.replace(
        'def custom_model():\n    return "model"',
        "class CustomModel:\n    def __init__(self, channel_last=True):\n"
        "        self.channel_last = channel_last",
    )
    zoo = _write_zoo(tmp_path, "zoo_cls", body)
    spec = load_model_spec(zoo, "zoo_cls.model_a.CustomModel", model_params="channel_last=False")
    assert spec.build_model().channel_last is False


def test_zoo_is_importable_as_model_zoo(tmp_path):
    zoo_dir = tmp_path / "my_zoo"
    zoo_dir.mkdir()
    zoo = _write_zoo(zoo_dir, "pkg", "from model_zoo.pkg.helpers import VALUE\n" + _MODEL)
    (zoo_dir / "pkg" / "helpers.py").write_text("VALUE = 42\n")
    spec = load_model_spec(zoo, "pkg.model_a.custom_model")
    assert spec.module.VALUE == 42
    # Another zoo loaded later in the same process gets its own `model_zoo`.
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other = _write_zoo(other_dir, "pkg2", "from model_zoo.pkg2.helpers import VALUE\n" + _MODEL)
    (other_dir / "pkg2" / "helpers.py").write_text("VALUE = 7\n")
    assert load_model_spec(other, "pkg2.model_a.custom_model").module.VALUE == 7


def test_a_missing_import_is_one_line_naming_the_package(tmp_path):
    zoo = _write_zoo(tmp_path, "zoo_pil", "import PIL_not_installed.Image\n" + _MODEL)
    with pytest.raises(ModelSpecError) as e:
        load_model_spec(zoo, "zoo_pil.model_a.custom_model")
    msg = str(e.value)
    assert "--model_def 'zoo_pil.model_a.custom_model'" in msg and "PIL_not_installed" in msg
    assert "requirements.txt" in msg and "\n" not in msg
    zoo = _write_zoo(tmp_path, "zoo_odd", "import elasticdl.python.no_such\n" + _MODEL)
    with pytest.raises(
        ModelSpecError,
        match="elasticdl.python[.a-z_]* of the original ElasticDL has no counterpart",
    ):
        load_model_spec(zoo, "zoo_odd.model_a.custom_model")


def test_a_spec_locates_its_model_by_the_same_field_names():
    import dataclasses

    from elasticdl.common.job_spec import JobSpec
    from elasticdl.common.model_utils import MODEL_LOCATION_FIELDS
    from elasticdl.common.replica_spec import WorkerSpec

    for spec_type in (JobSpec, WorkerSpec):
        names = {f.name for f in dataclasses.fields(spec_type)}
        assert set(MODEL_LOCATION_FIELDS) | {"model_zoo", "model_def"} <= names, spec_type
