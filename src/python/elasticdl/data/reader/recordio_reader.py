"""Reads RecordIO files: one shard per file, records are the raw bytes stored in the file."""
from __future__ import annotations

import logging
import os
from typing import Dict, Iterator, List, Optional, Tuple

from elasticdl.data import recordio
from elasticdl.data.reader.base import AbstractDataReader, DataReaderError, Shard, check_range

logger = logging.getLogger(__name__)


def list_data_files(origin: str) -> List[str]:
    """``origin`` itself if a file, else the visible regular files directly inside it, sorted.

    Hidden files are skipped: they include the temporary files of writers still at work.
    """
    if os.path.isfile(origin):
        return [origin]
    if not os.path.isdir(origin):
        raise DataReaderError(f"data origin {origin!r} does not exist; pass a file or directory")
    return [
        os.path.join(origin, n)
        for n in sorted(os.listdir(origin))
        if not n.startswith(".") and os.path.isfile(os.path.join(origin, n))
    ]


def recordio_files(origin: str) -> Tuple[List[str], List[str]]:
    """The files a RecordIO reader of ``origin`` reads: ``origin`` itself if a file, else the
    RecordIO files directly inside it (empty files count: they hold no records); and the
    files of the directory that are not RecordIO (README, _SUCCESS, ...), which it skips."""
    files = list_data_files(origin)
    if os.path.isfile(origin):
        return files, []
    chosen, skipped = [], []
    for path in files:
        if os.path.getsize(path) == 0 or recordio.is_recordio_file(path):
            chosen.append(path)
        else:
            skipped.append(path)
    return chosen, skipped


class RecordIODataReader(AbstractDataReader):
    """``data_origin`` is a RecordIO file or a directory of them.

    In a directory, files that are not RecordIO (README, _SUCCESS, ...) are skipped with a
    warning; empty files hold no records and give no shard. The master's task manager splits
    each file's shard into tasks, so ``records_per_task`` is not used here.
    """

    max_cached_chunks = 1  # decoded chunks kept per reader: tasks of one file come in order

    def __init__(self, data_origin: str, records_per_task: Optional[int] = None, **params):
        super().__init__(data_origin, records_per_task, **params)
        self._indexes: Dict[str, recordio.Index] = {}
        self._chunks: Dict[tuple, List[bytes]] = {}  # (path, chunk index) -> records, LRU

    def _files(self) -> List[str]:
        chosen, skipped = recordio_files(self.data_origin)
        for path in skipped:
            logger.warning("Skipping %s: not a RecordIO file", path)
        if not chosen:
            raise DataReaderError(
                f"directory {self.data_origin!r} contains no RecordIO files; "
                "point --training_data at RecordIO shards (e.g. from `elasticdl dataset prepare`)"
            )
        return chosen

    def index(self, path: str) -> recordio.Index:
        # Workers read many tasks from the same file: read its chunk headers once.
        idx = self._indexes.get(path)
        if idx is None:
            idx = recordio.Index(path)
            self._indexes[path] = idx
        return idx

    def create_shards(self) -> List[Shard]:
        shards = []
        for path in self._files():
            n = self.index(path).num_records()
            if n:
                shards.append(Shard(path, 0, n))
        return shards

    def read_records(self, shard_name: str, start: int, end: int) -> Iterator[bytes]:
        idx = self.index(shard_name)
        check_range(shard_name, start, end, idx.num_records())
        pos = start
        while pos < end:
            chunk_idx, offset = idx.locate(pos)
            records = self._chunk(shard_name, idx, chunk_idx)
            take = min(end - pos, len(records) - offset)
            yield from records[offset : offset + take]
            pos += take

    def _chunk(self, path: str, idx: recordio.Index, chunk_idx: int) -> List[bytes]:
        # A task is a small slice of a chunk (128 of 4096 records in the README job) and a
        # worker reads the next slices soon: keep the last decoded chunks instead of verifying
        # and decompressing the whole chunk again for every task.
        key = (path, chunk_idx)
        records = self._chunks.pop(key, None)
        if records is None:
            with open(path, "rb") as f:
                records = recordio.read_chunk(f, idx.chunk(chunk_idx), chunk_idx, path)
            while len(self._chunks) >= self.max_cached_chunks:
                self._chunks.pop(next(iter(self._chunks)))
        self._chunks[key] = records  # most recently used last
        return records
