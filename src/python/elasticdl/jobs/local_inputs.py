"""A local job's data, checked on this machine before anything is submitted.

The master of a local job reads its training, validation and prediction data here, with the
reader ``--data_reader_params`` names or the file names imply (RecordIO unless every file is
CSV or Parquet). Such a reader needs the origin to exist, and a RecordIO one needs a RecordIO
file in it: a job that would fail at its start for want of them is refused now, in one line
naming the flag and the fix, and nothing is written. A model that brings its own reader
(``custom_data_reader``) may read anything, so its data is not checked.
"""

from __future__ import annotations

import ast
import os

from elasticdl.common.job_spec import JobSpec
from elasticdl.common.spec_codec import SpecError

DATA_FIELDS = ("training_data", "validation_data", "prediction_data")
_FIX = (
    "point it at RecordIO shards (e.g. from 'elasticdl dataset prepare'), or name another "
    "reader in --data_reader_params (reader_type=CSV or reader_type=Parquet)"
)


def check_local_inputs(spec: JobSpec) -> None:
    """Raise ``SpecError`` (one line) for a data flag whose origin the job's reader cannot
    read: it does not exist, or holds no RecordIO file for a RecordIO reader."""
    origins = [(f, getattr(spec, f)) for f in DATA_FIELDS if getattr(spec, f)]
    origins = [(f, v) for f, v in origins if "://" not in v]  # URLs: the reader's business
    if not origins or _model_defines(spec, spec.custom_data_reader):
        return
    from elasticdl.data.reader import infer_reader_type, parse_data_reader_params
    from elasticdl.data.reader.recordio_reader import recordio_files

    reader_type = parse_data_reader_params(spec.data_reader_params).get("reader_type")
    for field, value in origins:
        path = os.path.expanduser(value)
        if not os.path.exists(path):
            raise SpecError(f"--{field} {value!r} does not exist on this machine; check the path")
        kind = str(reader_type or infer_reader_type(path)).strip().lower()
        if kind != "recordio":
            continue
        if os.path.isdir(path) and not recordio_files(path)[0]:
            raise SpecError(f"--{field} {value!r} holds no RecordIO file; {_FIX}")
        if os.path.isfile(path) and os.path.getsize(path) and not _is_recordio(path):
            raise SpecError(f"--{field} {value!r} is not a RecordIO file; {_FIX}")


def _is_recordio(path: str) -> bool:
    from elasticdl.data.recordio import is_recordio_file

    return is_recordio_file(path)


def _model_file(spec: JobSpec) -> str | None:
    zoo = os.path.expanduser(spec.model_zoo or ".")
    module_path = spec.model_def.rsplit(".", 1)[0].replace(".", os.sep)
    for candidate in (module_path + ".py", os.path.join(module_path, "__init__.py")):
        path = os.path.join(zoo, candidate)
        if os.path.isfile(path):
            return path
    return None


def _model_defines(spec: JobSpec, name: str) -> bool:
    """Whether the model file may define ``name`` (read, never run: the client does not
    import the user's model). Any mention of the name counts, and so does being unsure (a
    ``*`` import, an unreadable file)."""
    path = _model_file(spec)
    if not name or path is None:
        return True
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return True
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found = node.name == name
        elif isinstance(node, ast.alias):
            found = node.name == "*" or name in (node.asname, node.name.split(".")[-1])
        else:
            found = isinstance(node, ast.Name) and node.id == name
        if found:
            return True
    return False
