import pytest
from elasticdl.data.reader import CSVDataReader, DataReaderError, Shard, create_data_reader


def test_header_auto_shards_and_records(tmp_path):
    path = tmp_path / "iris.csv"
    rows = [f"{i}.0,{i % 3},name{i}" for i in range(10)]
    path.write_text("sepal,kind,name\n" + "\n".join(rows) + "\n")
    reader = create_data_reader(str(path), records_per_task=4)
    assert isinstance(reader, CSVDataReader)
    p = str(path)
    assert reader.create_shards() == [Shard(p, 0, 4), Shard(p, 4, 8), Shard(p, 8, 10)]
    assert list(reader.read_records(p, 3, 6)) == [r.encode() for r in rows[3:6]]
    assert reader.metadata.column_names == ["sepal", "kind", "name"]


def test_columns_given_no_header_crlf_blank_lines(tmp_path):
    path = tmp_path / "d.csv"
    path.write_bytes(b"1;a\r\n\r\n2;b\r\n\n3;c")  # CRLF, blank lines, no final newline
    reader = CSVDataReader(str(path), sep=";", columns=["x", "y"])
    assert reader.create_shards() == [Shard(str(path), 0, 3)]
    assert list(reader.read_records(str(path), 0, 3)) == [b"1;a", b"2;b", b"3;c"]
    assert reader.metadata.column_names == ["x", "y"]
    # With columns equal to the first line, auto mode treats it as a header.
    path.write_text("x;y\n1;a\n")
    reader = CSVDataReader(str(path), sep=";", columns="[x,y]")
    assert list(reader.read_records(str(path), 0, 1)) == [b"1;a"]
    # skip_header=false keeps the first line as data even without columns.
    reader = CSVDataReader(str(path), skip_header="false")
    assert reader.create_shards() == [Shard(str(path), 0, 2)]
    assert reader.metadata.column_names is None


def test_directory_and_large_file_blocks(tmp_path, monkeypatch):
    from elasticdl.data.reader import csv_reader

    monkeypatch.setattr(csv_reader, "_BLOCK", 7)  # force lines to straddle read blocks
    (tmp_path / "a.csv").write_bytes(
        b"h1,h2\r\n" + b"".join(b"%d,%d\r\n" % (i, i) for i in range(50))
    )
    (tmp_path / "b.csv").write_text("h1,h2\n5,5\n")
    reader = create_data_reader(str(tmp_path))
    shards = reader.create_shards()
    assert [(s.name.endswith("a.csv"), s.start, s.end) for s in shards] == [
        (True, 0, 50),
        (False, 0, 1),
    ]
    assert list(reader.read_records(shards[0].name, 0, 50)) == [
        b"%d,%d" % (i, i) for i in range(50)
    ]


def test_bad_params(tmp_path):
    with pytest.raises(DataReaderError, match="sep: expected one character"):
        CSVDataReader("x.csv", sep="::")
    with pytest.raises(DataReaderError, match="skip_header: expected one of true, false, auto"):
        CSVDataReader("x.csv", skip_header="maybe")
    with pytest.raises(DataReaderError, match="records_per_task must be a positive integer"):
        CSVDataReader("x.csv", records_per_task=0)


@pytest.mark.parametrize(
    "content", [bytes(range(256)) * 4, b"a,b\n1,2\n" * 3 + b"\x00", b"\x1f\x8b\x08\x00\x00\x00"]
)
def test_binary_or_compressed_file_is_not_csv(tmp_path, content):
    path = tmp_path / "data.csv"
    path.write_bytes(content)
    with pytest.raises(DataReaderError, match=r"data.csv: not a text file \(a NUL byte at offset"):
        create_data_reader(str(path)).create_shards()
