"""Reads RecordIO files: one shard per file, records are the raw bytes stored in the file."""
from __future__ import annotations

import logging
import os
from typing import Dict, Iterator, List, Optional

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


class RecordIODataReader(AbstractDataReader):
    """``data_origin`` is a RecordIO file or a directory of them.

    In a directory, files that are not RecordIO (README, _SUCCESS, ...) are skipped with a
    warning; empty files hold no records and give no shard. The master's task manager splits
    each file's shard into tasks, so ``records_per_task`` is not used here.
    """

    def __init__(self, data_origin: str, records_per_task: Optional[int] = None, **params):
        super().__init__(data_origin, records_per_task, **params)
        self._indexes: Dict[str, recordio.Index] = {}

    def _files(self) -> List[str]:
        files = list_data_files(self.data_origin)
        if os.path.isfile(self.data_origin):
            return files
        chosen = []
        for path in files:
            if os.path.getsize(path) == 0:
                chosen.append(path)
            elif recordio.is_recordio_file(path):
                chosen.append(path)
            else:
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
        with recordio.Scanner(shard_name, start, end - start, index=idx) as scanner:
            while True:
                batch = scanner.records(1024)
                if not batch:
                    return
                yield from batch
