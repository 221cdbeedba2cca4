"""Choosing a reader for a data origin, and parsing ``--data_reader_params``."""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Union

from elasticdl.data.reader.base import AbstractDataReader, DataReaderError

ParamValue = Union[str, List[str]]

READER_TYPES = ("RecordIO", "CSV", "Parquet")


def _reader_class(reader_type: str):
    # Imported lazily so that e.g. RecordIO users never import pyarrow.
    key = reader_type.strip().lower()
    if key == "recordio":
        from elasticdl.data.reader.recordio_reader import RecordIODataReader

        return RecordIODataReader
    if key in ("csv", "text"):
        from elasticdl.data.reader.csv_reader import CSVDataReader

        return CSVDataReader
    if key == "parquet":
        from elasticdl.data.reader.parquet_reader import ParquetDataReader

        return ParquetDataReader
    raise DataReaderError(
        f"reader_type: unknown value {reader_type!r}; choose one of {', '.join(READER_TYPES)}"
    )


def infer_reader_type(data_origin: str) -> str:
    """CSV for ``*.csv``, Parquet for ``*.parquet`` (for a directory: what all its visible
    files end with), else RecordIO."""
    names = [data_origin]
    if os.path.isdir(data_origin):
        names = [n for n in os.listdir(data_origin) if not n.startswith(".")] or names
    lowered = [n.lower() for n in names]
    if all(n.endswith(".csv") for n in lowered):
        return "CSV"
    if all(n.endswith(".parquet") for n in lowered):
        return "Parquet"
    return "RecordIO"


def create_data_reader(
    data_origin: str, records_per_task: Optional[int] = None, **params
) -> AbstractDataReader:
    """A reader for ``data_origin``; ``reader_type`` (RecordIO, CSV, Parquet) overrides the
    choice by file extension. Other params go to the reader."""
    if not data_origin:
        raise DataReaderError("data origin is empty; pass --training_data (or similar) a path")
    reader_type = params.pop("reader_type", None) or infer_reader_type(str(data_origin))
    return _reader_class(str(reader_type))(str(data_origin), records_per_task, **params)


def _split_top_level(text: str, sep: str) -> List[str]:
    """Split on ``sep`` outside quotes and brackets."""
    parts, buf, quote, depth = [], [], None, 0
    for ch in text:
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        elif ch == sep and depth == 0:
            parts.append("".join(buf))
            buf = []
            continue
        buf.append(ch)
    if quote:
        raise DataReaderError(f"data_reader_params: unterminated quote in {text!r}")
    parts.append("".join(buf))
    return parts


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def parse_data_reader_params(text: Optional[str]) -> Dict[str, ParamValue]:
    """Parse ``'k1=v1; k2="v 2"; columns=[a,b]'`` into ``{"k1": "v1", "k2": "v 2",
    "columns": ["a", "b"]}``. Values stay strings (readers convert them); a bracketed value
    becomes a list of strings; quotes around values and list items are removed."""
    params: Dict[str, ParamValue] = {}
    if not text or not text.strip():
        return params
    for item in _split_top_level(text, ";"):
        if not item.strip():
            continue
        if "=" not in item:
            raise DataReaderError(
                f"data_reader_params: {item.strip()!r} is not key=value; "
                'use the form "k1=v1; k2=v2; columns=[a,b]"'
            )
        key, value = item.split("=", 1)
        key, value = key.strip(), value.strip()
        if not key.isidentifier():
            raise DataReaderError(f"data_reader_params: invalid key {key!r} in {item.strip()!r}")
        if value.startswith("[") and value.endswith("]"):
            inner = value[1:-1]
            params[key] = [_unquote(v) for v in _split_top_level(inner, ",") if v.strip()]
        else:
            params[key] = _unquote(value)
    return params
