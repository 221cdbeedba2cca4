import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from elasticdl.data.reader import DataReaderError, ParquetDataReader, Shard, create_data_reader


@pytest.fixture
def table_path(tmp_path):
    table = pa.table(
        {
            "id": list(range(25)),
            "name": [f"n{i}" for i in range(25)],
            "score": [i / 2 for i in range(25)],
        }
    )
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=10)
    return str(path)


def test_row_group_shards_and_cross_group_reads(table_path):
    reader = create_data_reader(table_path)
    assert isinstance(reader, ParquetDataReader)
    assert reader.create_shards() == [
        Shard(table_path, 0, 10),
        Shard(table_path, 10, 20),
        Shard(table_path, 20, 25),
    ]
    rows = list(reader.read_records(table_path, 8, 22))
    assert [r["id"] for r in rows] == list(range(8, 22))
    assert rows[0] == {"id": 8, "name": "n8", "score": 4.0}
    md = reader.metadata
    assert md.column_names == ["id", "name", "score"]
    assert md.column_dtypes == ["int64", "string", "double"]


def test_records_per_task_and_columns(table_path):
    reader = ParquetDataReader(table_path, records_per_task=12, columns=["score", "id"])
    assert [(s.start, s.end) for s in reader.create_shards()] == [(0, 12), (12, 24), (24, 25)]
    assert list(reader.read_records(table_path, 24, 25)) == [{"score": 12.0, "id": 24}]
    with pytest.raises(DataReaderError, match=r"columns: \['nope'\] not in"):
        ParquetDataReader(table_path, columns="[nope]").create_shards()


def test_directory_and_not_parquet(tmp_path, table_path):
    (tmp_path / "x.parquet").write_bytes(b"garbage")
    reader = ParquetDataReader(str(tmp_path))
    with pytest.raises(DataReaderError, match="x.parquet: not a readable Parquet file"):
        reader.create_shards()


def test_files_of_different_schemas_are_refused(tmp_path):
    pq.write_table(pa.table({"x": [1, 2], "y": ["a", "b"]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": ["1"], "y": ["c"]}), tmp_path / "b.parquet")
    with pytest.raises(
        DataReaderError, match=r"b.parquet: schema differs from .*a.parquet in columns \['x'\]"
    ):
        ParquetDataReader(str(tmp_path)).create_shards()
    pq.write_table(pa.table({"z": [1]}), tmp_path / "b.parquet")
    with pytest.raises(DataReaderError, match=r"in columns \['x', 'y', 'z'\]"):
        ParquetDataReader(str(tmp_path)).create_shards()
    # Selecting the common columns reads both.
    pq.write_table(pa.table({"x": [3], "y": ["c"], "z": [1.0]}), tmp_path / "b.parquet")
    reader = ParquetDataReader(str(tmp_path), columns="[x,y]")
    assert sum(s.end - s.start for s in reader.create_shards()) == 3


def test_unreadable_row_group_is_one_line(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": list(range(1000))}), path, compression="none")
    reader = ParquetDataReader(str(path))
    shards = reader.create_shards()
    data = bytearray(path.read_bytes())
    data[10:200] = b"\xff" * 190  # the column chunk's pages, after the magic
    path.write_bytes(bytes(data))
    with pytest.raises(DataReaderError) as e:
        list(reader.read_records(str(path), shards[0].start, shards[0].end))
    assert "\n" not in str(e.value) and str(path) in str(e.value)
