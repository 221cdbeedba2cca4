"""The job spec's paths on the submitting machine: which fields name local files, making them
absolute, and checking what must exist before a job is submitted (the model zoo and its model
file)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from elasticdl.common.spec_codec import SpecError

if TYPE_CHECKING:
    from elasticdl.common.job_spec.fields import JobSpec

# Paths on this machine; on the local platform they are made absolute so the job does not
# depend on the directory its master starts in. Inputs only when they exist (they may also be
# table names or URLs); outputs always.
_LOCAL_INPUTS = (
    "training_data",
    "validation_data",
    "prediction_data",
    "checkpoint_dir_for_init",
    "tls_cert_file",
    "tls_key_file",
    "tls_ca_file",
)
_LOCAL_OUTPUTS = (
    "model_zoo",
    "checkpoint_dir",
    "output",
    "log_file_path",
    "tensorboard_log_dir",
    "cluster_spec",
    "job_dir",
)


def absolute_local_paths(spec: JobSpec) -> dict[str, str]:
    changes = {}
    for name in _LOCAL_INPUTS + _LOCAL_OUTPUTS:
        value = getattr(spec, name)
        if not value or "://" in value:
            continue
        expanded = os.path.expanduser(value)
        if name in _LOCAL_OUTPUTS or os.path.exists(expanded):
            absolute = os.path.abspath(expanded)
            if absolute != value:
                changes[name] = absolute
    return changes


def prebuilt_model_zoo(model_zoo: str) -> bool:
    """``--image_base`` with this ``--model_zoo`` runs the image as it is: an absolute path
    that does not exist here names the zoo inside the image (the original's ``/model_zoo``)."""
    return bool(model_zoo) and os.path.isabs(model_zoo) and not os.path.exists(model_zoo)


def looks_like_local_path(value: str) -> bool:
    # Data sources may also be table names ("project.table") or URLs; only check what is
    # clearly a filesystem path.
    return "://" not in value and (os.sep in value or value.startswith((".", "~")))


def check_model_zoo(model_zoo: str, model_def: str) -> None:
    """``model_def``'s file is in the directory ``model_zoo`` and compiles."""
    zoo = os.path.expanduser(model_zoo or ".")
    if not os.path.isdir(zoo):
        raise SpecError(f"--model_zoo {model_zoo!r} is not a directory; point it at your model zoo")
    module_path = model_def.rsplit(".", 1)[0].replace(".", os.sep)
    candidates = [
        os.path.join(zoo, module_path + ".py"),
        os.path.join(zoo, module_path, "__init__.py"),
    ]
    found = [c for c in candidates if os.path.isfile(c)]
    if not found:
        where = "--model_zoo" if model_zoo else "the current directory (set --model_zoo)"
        raise SpecError(
            f"--model_def {model_def!r}: no file {module_path}.py under {where} ({os.path.abspath(zoo)})"
        )
    _check_model_syntax(model_def, found[0])


def _check_model_syntax(model_def: str, path: str) -> None:
    """A model file that cannot compile fails here, in the client, instead of in the master
    after submission. Compiling runs none of its code (imports are the master's to check)."""
    try:
        with open(path, "rb") as f:
            compile(f.read(), path, "exec", dont_inherit=True)
    except SyntaxError as e:
        raise SpecError(
            f"--model_def {model_def!r}: {path} line {e.lineno}: SyntaxError: "
            f"{' '.join(str(e.msg).split())}; fix the model file"
        ) from None
    except (OSError, ValueError) as e:  # unreadable, or NUL bytes (ValueError before 3.12)
        raise SpecError(f"--model_def {model_def!r}: cannot read {path} as Python: {e}") from None
