import os

import pytest
from elasticdl.data import recordio
from elasticdl.data.reader import DataReaderError, RecordIODataReader, Shard, create_data_reader

GO_FILE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "testdata", "go_written_777.rio")


def _write(path, records, **kw):
    with recordio.Writer(path, **kw) as w:
        for r in records:
            w.write(r)


def test_shards_one_per_file_sorted_skipping_foreign_files(tmp_path, caplog):
    _write(tmp_path / "b.rio", [b"b%d" % i for i in range(5)])
    _write(tmp_path / "a.rio", [b"a%d" % i for i in range(3)], compressor="gzip")
    _write(tmp_path / "empty.rio", [])
    (tmp_path / "README.md").write_text("not data")
    (tmp_path / ".hidden.tmp").write_bytes(b"junk")
    (tmp_path / "sub").mkdir()
    reader = create_data_reader(str(tmp_path), records_per_task=2)
    assert isinstance(reader, RecordIODataReader)
    with caplog.at_level("WARNING"):
        shards = reader.create_shards()
    assert shards == [Shard(str(tmp_path / "a.rio"), 0, 3), Shard(str(tmp_path / "b.rio"), 0, 5)]
    assert "README.md" in caplog.text
    assert list(reader.read_records(str(tmp_path / "b.rio"), 1, 4)) == [b"b1", b"b2", b"b3"]
    assert reader.metadata.column_names is None


def test_go_file_ranges_across_many_tasks():
    reader = RecordIODataReader(GO_FILE)
    [shard] = reader.create_shards()
    assert (shard.start, shard.end) == (0, 777)
    whole = list(reader.read_records(GO_FILE, 0, 777))
    pieces = []
    for s in range(0, 777, 100):
        pieces.extend(reader.read_records(GO_FILE, s, min(s + 100, 777)))
    assert pieces == whole and len(whole) == 777


def test_errors(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DataReaderError, match="contains no RecordIO files"):
        RecordIODataReader(str(tmp_path)).create_shards()
    with pytest.raises(DataReaderError, match="does not exist"):
        RecordIODataReader(str(tmp_path / "nope")).create_shards()
    reader = RecordIODataReader(GO_FILE)
    with pytest.raises(DataReaderError, match=r"range \[700, 800\) is outside \[0, 777\)"):
        list(reader.read_records(GO_FILE, 700, 800))
