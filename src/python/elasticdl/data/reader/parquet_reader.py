"""Reads Parquet files with pyarrow: shards are row ranges, records are ``dict`` rows.

Each record is a plain ``{column: value}`` dict (Python scalars; ``None`` for nulls), so a
model's ``feed`` can build tensors from it without a second parse. Without
``records_per_task`` a file gives one shard per row group (the natural unit Parquet can read
alone); with it, shards of that many rows. Reading a range decodes only the row groups it
overlaps.

Params: ``columns`` (read only these columns, in this order).
"""
from __future__ import annotations

import bisect
from typing import Dict, Iterator, List, Optional

from elasticdl.data.reader.base import (
    AbstractDataReader,
    DataReaderError,
    Metadata,
    Shard,
    check_range,
    parse_list,
    split_range,
)
from elasticdl.data.reader.recordio_reader import list_data_files


class ParquetDataReader(AbstractDataReader):
    """``data_origin`` is a Parquet file or a directory of ``*.parquet`` files."""

    def __init__(self, data_origin: str, records_per_task: Optional[int] = None, **params):
        super().__init__(data_origin, records_per_task, **params)
        self.columns = parse_list("columns", params.get("columns"))
        self._files_cache: Dict[str, object] = {}

    def _files(self) -> List[str]:
        files = list_data_files(self.data_origin)
        if len(files) > 1 or files and files[0] != self.data_origin:
            files = [f for f in files if f.endswith(".parquet")]
        if not files:
            raise DataReaderError(f"directory {self.data_origin!r} contains no .parquet files")
        return files

    def _open(self, path: str):
        pf = self._files_cache.get(path)
        if pf is None:
            import pyarrow.parquet as pq  # heavy; only readers of Parquet pay for it

            try:
                pf = pq.ParquetFile(path)
            except Exception as e:  # noqa: BLE001 - pyarrow raises several types
                raise DataReaderError(
                    f"{path}: not a readable Parquet file: {(str(e) or type(e).__name__).splitlines()[0]}"
                ) from e
            if self.columns:
                missing = [c for c in self.columns if c not in pf.schema_arrow.names]
                if missing:
                    raise DataReaderError(
                        f"columns: {missing} not in {path} (it has {pf.schema_arrow.names})"
                    )
            self._files_cache[path] = pf
        return pf

    def _group_starts(self, pf) -> List[int]:
        starts, total = [], 0
        for i in range(pf.metadata.num_row_groups):
            starts.append(total)
            total += pf.metadata.row_group(i).num_rows
        return starts

    def _schema(self, pf):
        """The (name, type) pairs of the columns read: what every record dict holds."""
        schema = pf.schema_arrow
        names = self.columns or schema.names
        return [(n, str(schema.field(n).type)) for n in names]

    def create_shards(self) -> List[Shard]:
        shards: List[Shard] = []
        first = None
        for path in self._files():
            pf = self._open(path)
            schema = self._schema(pf)
            if first is None:
                first = (path, schema)
            elif schema != first[1]:
                # Records of one job must look alike: the model's feed reads them by name.
                differ = sorted(
                    {n for n, _ in set(schema) ^ set(first[1])}
                    or {n for (n, _), (m, _) in zip(schema, first[1]) if n != m}
                )
                raise DataReaderError(
                    f"{path}: schema differs from {first[0]} in columns {differ} "
                    f"({dict(schema)} vs {dict(first[1])}); give files of one schema, or "
                    "select common columns with columns=[...]"
                )
            total = pf.metadata.num_rows
            if self.records_per_task:
                shards.extend(split_range(path, 0, total, self.records_per_task))
            else:
                bounds = self._group_starts(pf) + [total]
                shards.extend(Shard(path, a, b) for a, b in zip(bounds, bounds[1:]) if b > a)
        return shards

    def read_records(self, shard_name: str, start: int, end: int) -> Iterator[dict]:
        pf = self._open(shard_name)
        check_range(shard_name, start, end, pf.metadata.num_rows)
        if start == end:
            return
        starts = self._group_starts(pf)
        first = bisect.bisect_right(starts, start) - 1
        last = bisect.bisect_right(starts, end - 1) - 1
        for g in range(first, last + 1):
            try:
                table = pf.read_row_group(g, columns=self.columns)
            except Exception as e:  # noqa: BLE001 - pyarrow raises several types
                raise DataReaderError(
                    f"{shard_name}: row group {g} is unreadable: {str(e).splitlines()[0]}"
                ) from e
            lo = max(start - starts[g], 0)
            hi = min(end - starts[g], table.num_rows)
            yield from table.slice(lo, hi - lo).to_pylist()

    @property
    def metadata(self) -> Metadata:
        schema = self._open(self._files()[0]).schema_arrow
        names = self.columns or schema.names
        return Metadata(
            column_names=list(names),
            column_dtypes=[str(schema.field(n).type) for n in names],
        )
