"""Reads CSV/text files: shards of lines, each record the raw bytes of one line.

Records are whole lines (without the line break) so the model's ``feed`` parses them with
``tf.io.decode_csv`` as in the original ElasticDL. A line index (byte offsets of every
non-blank line) is built once per file with NumPy, so reading any ``[start, end)`` range is a
single seek and read. Quoted fields spanning several lines are not supported (one record per
physical line), the same as the original reader.

Params (``--data_reader_params``):
  ``sep``          field separator used to parse the header (default ``,``)
  ``columns``      column names, e.g. ``columns=[age,income]``
  ``skip_header``  ``true``: the first line is a header; ``false``: it is data; ``auto``
                   (default): without ``columns`` the first line is the header, with
                   ``columns`` it is a header only if it equals them.
"""
from __future__ import annotations

import csv
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
from elasticdl.data.reader.base import (
    AbstractDataReader,
    DataReaderError,
    Metadata,
    Shard,
    check_range,
    parse_bool,
    parse_list,
    split_range,
)
from elasticdl.data.reader.recordio_reader import list_data_files

_BLOCK = 16 * 1024 * 1024


def _line_spans(path: str) -> Tuple[np.ndarray, np.ndarray]:
    """Start and end byte offsets of every non-empty line (end excludes ``\\n``/``\\r\\n``)."""
    starts, ends = [], []
    base = 0  # file offset of the current block
    line_start = 0
    prev_byte = -1  # last byte of the previous block, to see a "\\r" split from its "\\n"
    with open(path, "rb") as f:
        while True:
            block = f.read(_BLOCK)
            if not block:
                break
            arr = np.frombuffer(block, dtype=np.uint8)
            nul = np.flatnonzero(arr == 0)
            if nul.size:
                # Text never holds NUL bytes; binary or compressed files (data.csv.gz) do, and
                # their "lines" would reach the model's decode_csv as garbage.
                raise DataReaderError(
                    f"{path}: not a text file (a NUL byte at offset {base + int(nul[0])}); "
                    "CSV data must be uncompressed text"
                )
            nl = np.flatnonzero(arr == 10)
            if nl.size:
                before = nl - 1
                cr = np.where(before >= 0, arr[np.maximum(before, 0)] == 13, prev_byte == 13)
                e = nl.astype(np.int64) + base - cr
                s = np.concatenate(([line_start], nl[:-1].astype(np.int64) + 1 + base))
                starts.append(s)
                ends.append(e)
                line_start = int(nl[-1]) + 1 + base
            prev_byte = int(arr[-1])
            base += len(block)
    if line_start < base:  # last line without a trailing newline
        starts.append(np.array([line_start], np.int64))
        ends.append(np.array([base - (prev_byte == 13)], np.int64))
    if not starts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    s = np.concatenate(starts)
    e = np.concatenate(ends)
    keep = e > s  # empty lines are not records
    return s[keep], e[keep]


class CSVDataReader(AbstractDataReader):
    """``data_origin`` is a CSV file or a directory of them (every visible file is read)."""

    def __init__(self, data_origin: str, records_per_task: Optional[int] = None, **params):
        super().__init__(data_origin, records_per_task, **params)
        self.sep = str(params.get("sep", ","))
        if len(self.sep) != 1:
            raise DataReaderError(f"sep: expected one character, got {self.sep!r}")
        self._given_columns = parse_list("columns", params.get("columns"))
        self._skip_header = parse_bool("skip_header", params.get("skip_header", "auto"), True)
        self._spans: Dict[str, Tuple[np.ndarray, np.ndarray, int]] = {}
        self._header: Optional[List[str]] = None

    def _file_info(self, path: str) -> Tuple[np.ndarray, np.ndarray, int]:
        """(line starts, line ends, index of the first data line) of ``path``, cached."""
        info = self._spans.get(path)
        if info is None:
            try:
                starts, ends = _line_spans(path)
            except OSError as e:
                raise DataReaderError(f"{path}: cannot read: {e.strerror or e}") from e
            first = 0
            if starts.size:
                with open(path, "rb") as f:
                    f.seek(int(starts[0]))
                    line = f.read(int(ends[0] - starts[0])).decode("utf-8", "replace")
                fields = [x.strip() for x in next(csv.reader([line], delimiter=self.sep))]
                is_header = self._skip_header
                if is_header is None:
                    is_header = self._given_columns is None or fields == self._given_columns
                if is_header:
                    first = 1
                    if self._header is None:
                        self._header = fields
            info = (starts, ends, first)
            self._spans[path] = info
        return info

    def _files(self) -> List[str]:
        files = list_data_files(self.data_origin)
        if not files:
            raise DataReaderError(f"directory {self.data_origin!r} contains no CSV files")
        return files

    def create_shards(self) -> List[Shard]:
        shards: List[Shard] = []
        for path in self._files():
            starts, _, first = self._file_info(path)
            shards.extend(split_range(path, 0, len(starts) - first, self.records_per_task))
        return shards

    def read_records(self, shard_name: str, start: int, end: int) -> Iterator[bytes]:
        starts, ends, first = self._file_info(shard_name)
        check_range(shard_name, start, end, len(starts) - first)
        if start == end:
            return
        lo, hi = start + first, end + first
        with open(shard_name, "rb") as f:
            base = int(starts[lo])
            f.seek(base)
            buf = f.read(int(ends[hi - 1]) - base)
        for s, e in zip((starts[lo:hi] - base).tolist(), (ends[lo:hi] - base).tolist()):
            yield buf[s:e]

    @property
    def metadata(self) -> Metadata:
        if self._given_columns is not None:
            return Metadata(column_names=list(self._given_columns))
        if self._header is None and self._skip_header is not False:
            for path in self._files():
                self._file_info(path)
                if self._header is not None:
                    break
        return Metadata(column_names=None if self._header is None else list(self._header))
