"""Data readers: shards for the master, records for the workers (no TensorFlow import).

``create_data_reader(origin, records_per_task, **params)`` picks a reader by the
``reader_type`` param or by file extension:

* :class:`RecordIODataReader` - one shard per RecordIO file; records are ``bytes``.
* :class:`CSVDataReader` - shards of lines; records are the raw line ``bytes``;
  ``metadata.column_names`` from ``columns`` or the header.
* :class:`ParquetDataReader` - shards of rows (row groups by default); records are
  ``dict`` rows ``{column: value}``; metadata has column names and Arrow dtypes.
"""
from elasticdl.data.reader.base import AbstractDataReader, DataReaderError, Metadata, Shard
from elasticdl.data.reader.csv_reader import CSVDataReader
from elasticdl.data.reader.factory import (
    READER_TYPES,
    create_data_reader,
    infer_reader_type,
    parse_data_reader_params,
)
from elasticdl.data.reader.parquet_reader import ParquetDataReader
from elasticdl.data.reader.recordio_reader import RecordIODataReader

__all__ = [
    "AbstractDataReader",
    "CSVDataReader",
    "DataReaderError",
    "Metadata",
    "ParquetDataReader",
    "READER_TYPES",
    "RecordIODataReader",
    "Shard",
    "create_data_reader",
    "infer_reader_type",
    "parse_data_reader_params",
]
