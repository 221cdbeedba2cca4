"""Loading a model definition from the model zoo, and describing its optimizer for the PS.

A model file (`--model_def a.b.custom_model` -> `<model_zoo>/a/b.py`) provides the model function
or class plus `feed`, `loss`, `optimizer`, `eval_metrics_fn` and optionally `callbacks`,
`custom_data_reader` and `PredictionOutputsProcessor` (names overridable by CLI flags). The
master and the workers both load the spec, so loading must not build the model or touch TF
beyond importing the user's module.

Model files written for the original ElasticDL load unchanged: `dataset_fn` (v0.2's name of
`feed`, also with v0.1's two arguments `(dataset, mode)`) is found when there is no `feed`;
`--model_params "k1=v1; k2=v2"` become keyword arguments of the model function; and the zoo is
importable as the package `model_zoo` (`from model_zoo.cifar10.data_parser import ...`), as the
original's images made it by placing the zoo at `/model_zoo`.
"""
from __future__ import annotations

import contextlib
import enum
import functools
import importlib.machinery
import importlib.util
import inspect
import os
import sys
import threading
import traceback
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Dict, Iterator, Optional, Tuple


class Mode(str, enum.Enum):
    """What a dataset/model call is for; a str so `mode == "training"` also works in user code."""

    TRAINING = "training"
    EVALUATION = "evaluation"
    PREDICTION = "prediction"

    def __str__(self) -> str:  # so f-strings and logs show "training", not "Mode.TRAINING"
        return self.value


class ModelSpecError(ValueError):
    """The model definition cannot be used as given (bad path, missing function, ...)."""


@dataclass
class ModelSpec:
    module: ModuleType
    model_fn: Callable[..., Any]  # function returning a keras.Model, or a keras.Model subclass
    loss: Callable[..., Any]
    optimizer: Callable[..., Any]
    feed: Optional[Callable[..., Any]]
    eval_metrics_fn: Optional[Callable[..., Any]]
    callbacks: Optional[Callable[..., Any]] = None
    custom_data_reader: Optional[Callable[..., Any]] = None
    prediction_outputs_processor: Optional[Any] = None
    model_file: str = ""

    # The original API called the model entry `custom_model`; keep both spellings working.
    @property
    def custom_model(self) -> Callable[..., Any]:
        return self.model_fn

    def build_model(self, **model_params):
        return self.model_fn(**model_params)


def get_module_file_path(model_zoo: str, model_def: str) -> str:
    """`mnist.mnist_functional_api.custom_model` -> `<model_zoo>/mnist/mnist_functional_api.py`."""
    parts = model_def.split(".")
    if len(parts) < 2 or not all(parts):
        raise ModelSpecError(
            f"--model_def {model_def!r} must look like 'package.module.custom_model' "
            "(module path inside --model_zoo, then the model function or class)"
        )
    return os.path.join(model_zoo, *parts[:-1]) + ".py"


ZOO_PACKAGE = "model_zoo"


def _register_zoo_package(model_zoo: str) -> None:
    """Make `import model_zoo.<dir>...` find the files of `model_zoo` (an absolute directory),
    whatever the directory is called."""
    current = sys.modules.get(ZOO_PACKAGE)
    if current is not None and list(getattr(current, "__path__", []) or []) == [model_zoo]:
        return
    for name in [n for n in list(sys.modules) if n.startswith(ZOO_PACKAGE + ".")]:
        del sys.modules[name]  # modules of another zoo loaded earlier in this process
    spec = importlib.machinery.ModuleSpec(ZOO_PACKAGE, None, is_package=True)
    spec.submodule_search_locations = [model_zoo]
    sys.modules[ZOO_PACKAGE] = importlib.util.module_from_spec(spec)


def _import_model_module(model_zoo: str, model_def: str) -> Tuple[ModuleType, str]:
    if not model_zoo:
        raise ModelSpecError("--model_zoo is empty: pass the directory that holds the model files")
    model_zoo = os.path.abspath(model_zoo)
    if not os.path.isdir(model_zoo):
        raise ModelSpecError(f"--model_zoo {model_zoo} is not a directory")
    path = get_module_file_path(model_zoo, model_def)
    if not os.path.isfile(path):
        raise ModelSpecError(
            f"--model_def {model_def!r}: model file {path} does not exist under --model_zoo"
        )
    # Model files import their siblings (`from mnist import common`), so the zoo root must be
    # importable; import through the package path so relative imports inside the zoo work too.
    if model_zoo not in sys.path:
        sys.path.insert(0, model_zoo)
    _register_zoo_package(model_zoo)
    _prepare_runtime(model_zoo, path)
    module_name = ".".join(model_def.split(".")[:-1])
    try:
        with _exits_raise():
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError:
                # A directory without __init__.py that clashes with an installed package: load
                # the file.
                spec = importlib.util.spec_from_file_location(module_name, path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[module_name] = module
                spec.loader.exec_module(module)
            if os.path.abspath(getattr(module, "__file__", "") or "") != path:
                # An installed package shadows the zoo's module name: load the zoo's file
                # explicitly.
                spec = importlib.util.spec_from_file_location(module_name, path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
    except (SystemExit, _ProcessExit) as e:
        # Left to propagate, the exit would end the master or worker with the model's status and
        # no error line (status 0 even read as success).
        call = "os._exit" if isinstance(e, _ProcessExit) else "sys.exit"
        raise ModelSpecError(
            f"--model_def {model_def!r}: {_zoo_line(e, model_zoo, path)} called "
            f"{call}({e.code!r}) at import; raise an exception there instead of exiting"
        ) from None
    except ImportError as e:
        raise ModelSpecError(_import_error_message(model_def, path, e, model_zoo)) from None
    except SyntaxError as e:
        # SyntaxError's own position: the traceback ends in the import machinery.
        where = f"{e.filename or path} line {e.lineno}"
        raise ModelSpecError(
            f"--model_def {model_def!r}: {where}: SyntaxError: {_one_line(e.msg)}; fix the "
            "model file"
        ) from None
    except Exception as e:  # noqa: BLE001 - user code at import: one line, not a traceback
        raise ModelSpecError(
            f"--model_def {model_def!r}: importing {path} raised {type(e).__name__} at "
            f"{_zoo_line(e, model_zoo, path)}: {_one_line(str(e))}; fix the model file"
        ) from None
    return module, path


class _ProcessExit(BaseException):
    """os._exit called by a model file while it is imported, raised in its place."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


@contextlib.contextmanager
def _exits_raise() -> Iterator[None]:
    """While this thread imports a model file, os._exit raises _ProcessExit instead: the real
    one would end the process before any error line is written. Other threads exit as before."""
    real_exit, importer = os._exit, threading.get_ident()

    def _exit(code: int) -> None:
        if threading.get_ident() == importer:
            raise _ProcessExit(code)
        real_exit(code)

    os._exit = _exit
    try:
        yield
    finally:
        os._exit = real_exit


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _zoo_line(error: BaseException, model_zoo: str, path: str) -> str:
    """'<file> line <n>': the innermost place inside the model zoo that raised `error`."""
    inside = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if os.path.abspath(f.filename).startswith(model_zoo + os.sep)
    ]
    if not inside:
        return f"{path} (line unknown)"
    return f"{inside[-1].filename} line {inside[-1].lineno}"


def _prepare_runtime(model_zoo: str, path: str) -> None:
    """Before the model file imports TensorFlow's Keras: choose Keras 2 (tf-keras) for a model
    written for it, and layer the zoo's requirements.txt over the runtime (common.runtime_env)."""
    from elasticdl.common import runtime_env

    try:
        keras2 = runtime_env.uses_keras2(path)
        if keras2:
            os.environ[runtime_env.LEGACY_KERAS_ENV] = "1"  # read at the first use of tf.keras
        runtime_env.ensure(model_zoo, keras2)
    except runtime_env.RuntimeEnvError as e:
        raise ModelSpecError(str(e)) from None


def _import_error_message(
    model_def: str, path: str, error: ImportError, model_zoo: str = ""
) -> str:
    missing = error.name or ""
    if missing.startswith("elasticdl."):
        fix = (
            f"{missing} of the original ElasticDL has no counterpart here (README: "
            "'Coming from ElasticDL 0.x' lists what there is)"
        )
    else:
        fix = (
            "install it where the job runs (list it in the model zoo's requirements.txt and "
            "build the image with 'elasticdl zoo build')"
        )
    where = _zoo_line(error, model_zoo, path) if model_zoo else path
    return (
        f"--model_def {model_def!r}: importing {path} failed at {where}: "
        f"{_one_line(str(error))}; {fix}"
    )


def _get(module: ModuleType, path: str, name: str, flag: str, required: bool):
    if not name:
        if required:
            raise ModelSpecError(f"{flag} is empty: name the function defined in {path}")
        return None
    obj = getattr(module, name, None)
    if obj is None and required:
        raise ModelSpecError(
            f"{flag}: {name!r} is not defined in {path}; define it or pass {flag}=<name>"
        )
    return obj


def _positional_arity(fn: Callable[..., Any]) -> Optional[int]:
    """How many positional arguments `fn` takes; None when it takes any number."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    positional = 0
    for p in params:
        if p.kind == p.VAR_POSITIONAL:
            return None
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            positional += 1
    return positional


def _resolve_feed(module, path, feed: str, dataset_fn: str, required: bool):
    """The feed function: `--dataset_fn` (v0.2's flag) or `--feed`; a model file of v0.2 that
    defines `dataset_fn` and no `feed` needs neither flag. v0.1's `dataset_fn(dataset, mode)`
    and `dataset_fn(dataset)` are called with only those arguments."""
    flag = "--feed"
    if dataset_fn:
        if feed not in ("feed", dataset_fn):
            raise ModelSpecError(
                f"--feed={feed} and --dataset_fn={dataset_fn} name different functions; "
                "pass only one (--dataset_fn is the original ElasticDL's name of --feed)"
            )
        feed, flag = dataset_fn, "--dataset_fn"
    elif feed == "feed" and getattr(module, "feed", None) is None:
        if getattr(module, "dataset_fn", None) is not None:
            feed, flag = "dataset_fn", "--dataset_fn"
    fn = _get(module, path, feed, flag, required=required)
    arity = _positional_arity(fn) if fn is not None else None
    if arity in (1, 2):
        original = fn

        @functools.wraps(original)
        def fn(dataset, mode, metadata=None):
            return original(dataset, mode) if arity == 2 else original(dataset)

    return fn


def _bind_model_params(model_fn, model_name: str, path: str, model_params: str):
    """`--model_params "k1=v1; k2=v2"` -> the model function with those keyword arguments."""
    if not model_params:
        return model_fn
    try:
        params = get_dict_from_params_str(model_params)
    except ModelSpecError as e:
        raise ModelSpecError(f"--model_params: {e}") from None
    try:
        target = model_fn.__init__ if inspect.isclass(model_fn) else model_fn
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        accepted = signature.parameters
        takes_any = any(p.kind == p.VAR_KEYWORD for p in accepted.values())
        unknown = sorted(k for k in params if k not in accepted and not takes_any)
        if unknown:
            names = [
                n
                for n, p in accepted.items()
                if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            ]
            raise ModelSpecError(
                f"--model_params: {model_name} in {path} takes no parameter "
                f"{', '.join(repr(k) for k in unknown)} (it takes: {', '.join(names) or 'none'})"
            )
    return functools.partial(model_fn, **params)


# The fields of a job spec (and of the worker spec derived from it) that locate the model.
MODEL_LOCATION_FIELDS = (
    "feed",
    "loss",
    "optimizer",
    "eval_metrics_fn",
    "callbacks",
    "custom_data_reader",
    "prediction_outputs_processor",
    "dataset_fn",
    "model_params",
)


def load_model_of(spec, **requirements: bool) -> ModelSpec:
    """:func:`load_model_spec` for a job or worker spec (its ``model_zoo``, ``model_def`` and
    the names of the model file's entry points); ``requirements``: ``require_feed``,
    ``require_eval_metrics_fn``."""
    names = {field: getattr(spec, field) for field in MODEL_LOCATION_FIELDS}
    return load_model_spec(spec.model_zoo, spec.model_def, **names, **requirements)


def load_model_spec(
    model_zoo: str,
    model_def: str,
    feed: str = "feed",
    loss: str = "loss",
    optimizer: str = "optimizer",
    eval_metrics_fn: str = "eval_metrics_fn",
    callbacks: str = "callbacks",
    custom_data_reader: str = "custom_data_reader",
    prediction_outputs_processor: str = "PredictionOutputsProcessor",
    require_feed: bool = True,
    require_eval_metrics_fn: bool = True,
    dataset_fn: str = "",
    model_params: str = "",
) -> ModelSpec:
    """Import the model file and collect its entry points; missing required ones -> ModelSpecError.

    `require_feed=False` is for jobs whose data reader supplies a default feed (ODPS-style
    tables); `require_eval_metrics_fn=False` for jobs that never evaluate (prediction).
    `dataset_fn` names the feed function as the original's `--dataset_fn` did; `model_params`
    ("k1=v1; k2=v2") are bound as keyword arguments of the model function.
    """
    module, path = _import_model_module(model_zoo, model_def)
    model_name = model_def.split(".")[-1]
    model_fn = _get(module, path, model_name, "--model_def", required=True)
    if not callable(model_fn):
        raise ModelSpecError(f"--model_def: {model_name!r} in {path} is not a function or class")
    model_fn = _bind_model_params(model_fn, model_name, path, model_params)
    return ModelSpec(
        module=module,
        model_fn=model_fn,
        loss=_get(module, path, loss, "--loss", required=True),
        optimizer=_get(module, path, optimizer, "--optimizer", required=True),
        feed=_resolve_feed(module, path, feed, dataset_fn, required=require_feed),
        eval_metrics_fn=_get(
            module, path, eval_metrics_fn, "--eval_metrics_fn", required=require_eval_metrics_fn
        ),
        callbacks=_get(module, path, callbacks, "--callbacks", required=False),
        custom_data_reader=_get(
            module, path, custom_data_reader, "--custom_data_reader", required=False
        ),
        prediction_outputs_processor=_get(
            module,
            path,
            prediction_outputs_processor,
            "--prediction_outputs_processor",
            required=False,
        ),
        model_file=path,
    )


def get_dict_from_params_str(params_str: Optional[str]) -> Dict[str, Any]:
    """Parse `"k1=v1; k2=[1, 2]; k3='x'"` (the --data_reader_params format) into a dict.

    Values are Python literals when they parse as one, otherwise kept as plain strings, so
    `reader_type=RecordIO` and `columns=["a", "b"]` both work.
    """
    import ast

    out: Dict[str, Any] = {}
    if not params_str:
        return out
    for item in params_str.split(";"):
        item = item.strip()
        if not item:
            continue
        if "=" not in item:
            raise ModelSpecError(f"parameter {item!r} must be key=value (items separated by ';')")
        key, value = item.split("=", 1)
        key, value = key.strip(), value.strip()
        if not key:
            raise ModelSpecError(f"parameter {item!r} has an empty key")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


# ----------------------------------------------------------------------------------------------
# Optimizer description for the PS (`-opt_type`, `-opt_args`)
# ----------------------------------------------------------------------------------------------
SUPPORTED_OPTIMIZERS = ("SGD", "Adam", "Adagrad")


class UnsupportedOptimizerError(ValueError):
    pass


def _num(value) -> str:
    """Shortest decimal that round-trips the float32 the optimizer holds (0.1, not 0.1000000015)."""
    import numpy as np

    return np.format_float_positional(np.float32(float(np.asarray(value))), trim="-")


def _bool(value) -> str:
    return "true" if bool(value) else "false"


def get_optimizer_info(optimizer) -> Tuple[str, str]:
    """(opt_type, opt_args) of a Keras optimizer, in the PS's `k=v;` format.

    SGD with momentum > 0 becomes "Momentum" (the PS runs a different kernel for it).
    """
    kind = type(optimizer).__name__
    lr = _num(optimizer.learning_rate)
    if kind == "SGD":
        momentum = float(getattr(optimizer, "momentum", 0.0) or 0.0)
        if momentum > 0:
            nesterov = _bool(getattr(optimizer, "nesterov", False))
            return "Momentum", f"learning_rate={lr};momentum={_num(momentum)};nesterov={nesterov};"
        return "SGD", f"learning_rate={lr};"
    if kind == "Adam":
        return "Adam", (
            f"learning_rate={lr};beta_1={_num(optimizer.beta_1)};beta_2={_num(optimizer.beta_2)};"
            f"epsilon={_num(optimizer.epsilon)};amsgrad={_bool(optimizer.amsgrad)};"
        )
    if kind == "Adagrad":
        return "Adagrad", f"learning_rate={lr};epsilon={_num(optimizer.epsilon)};"
    raise UnsupportedOptimizerError(
        f"optimizer {kind} is not supported by the parameter server; "
        f"use one of: {', '.join(SUPPORTED_OPTIMIZERS)} (keras.optimizers)"
    )
