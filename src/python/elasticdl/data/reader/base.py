"""What every data reader provides: shards for the master, records for the workers.

A reader turns a data origin (a file, a directory, a table) into *shards*: named, contiguous
record ranges ``[start, end)``. The master cuts shards into tasks of ``records_per_task``
records and hands tasks to workers, which call :meth:`AbstractDataReader.read_records` with the
task's shard name and range. Record numbering inside a shard name is the reader's own (line
number for CSV, record index for RecordIO, row for Parquet), so any sub-range can be read
without reading what comes before it.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence

from elasticdl.common import spec_codec
from elasticdl.common.types import Shard

__all__ = ["AbstractDataReader", "DataReaderError", "Metadata", "Shard"]


class DataReaderError(ValueError):
    """Bad reader configuration or unreadable data; the message is one line naming the fix."""


@dataclass(frozen=True)
class Metadata:
    """Column names/dtypes the model's ``feed`` may use; ``None`` where the format has none."""

    column_names: Optional[Sequence[str]] = None
    column_dtypes: Optional[Sequence[str]] = None


class AbstractDataReader(abc.ABC):
    """Base of all readers; ``params`` are the parsed ``--data_reader_params``."""

    def __init__(self, data_origin: str, records_per_task: Optional[int] = None, **params):
        if records_per_task is not None and int(records_per_task) <= 0:
            raise DataReaderError(
                f"records_per_task must be a positive integer, got {records_per_task}"
            )
        self.data_origin = str(data_origin)
        self.records_per_task = None if records_per_task is None else int(records_per_task)
        self.params = dict(params)

    @abc.abstractmethod
    def create_shards(self) -> List[Shard]:
        """All shards of the data origin, in a stable order."""

    @abc.abstractmethod
    def read_records(self, shard_name: str, start: int, end: int) -> Iterator:
        """Yield the records ``[start, end)`` of ``shard_name``."""

    @property
    def metadata(self) -> Metadata:
        return Metadata()


def split_range(name: str, start: int, end: int, size: Optional[int]) -> List[Shard]:
    """``[start, end)`` of ``name`` as shards of at most ``size`` records (None: one shard)."""
    if end <= start:
        return []
    if not size:
        return [Shard(name, start, end)]
    return [Shard(name, s, min(s + size, end)) for s in range(start, end, size)]


def parse_bool(name: str, value, allow_auto: bool = False):
    """Reader params come from a command line: accept true/false/1/0/yes/no (and 'auto')."""
    if value is None:
        return value
    if allow_auto and str(value).strip().lower() == "auto":
        return None
    try:
        return spec_codec.parse_bool(value)
    except ValueError:
        choices = "true, false" + (", auto" if allow_auto else "")
        raise DataReaderError(f"{name}: expected one of {choices}, got {value!r}") from None


def parse_list(name: str, value) -> Optional[List[str]]:
    """A list param: already a list, or a comma-separated string (brackets optional)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        items = [str(v).strip() for v in value]
    else:
        text = str(value).strip()
        if text.startswith("[") and text.endswith("]"):
            text = text[1:-1]
        items = [v.strip().strip("\"'") for v in text.split(",")]
    items = [v for v in items if v]
    if not items:
        raise DataReaderError(f"{name}: expected a non-empty list like [a,b,c], got {value!r}")
    return items


def check_range(shard_name: str, start: int, end: int, total: int) -> None:
    if not 0 <= start <= end <= total:
        raise DataReaderError(
            f"{shard_name}: record range [{start}, {end}) is outside [0, {total})"
        )
