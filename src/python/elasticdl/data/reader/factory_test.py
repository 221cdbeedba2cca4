import subprocess
import sys

import pytest
from elasticdl.data.reader import DataReaderError, create_data_reader, parse_data_reader_params


def test_parse_original_syntax():
    got = parse_data_reader_params(
        'reader_type=CSV; sep=";"; columns=[a, "b c",d]; label_col="class"; empty='
    )
    assert got == {
        "reader_type": "CSV",
        "sep": ";",
        "columns": ["a", "b c", "d"],
        "label_col": "class",
        "empty": "",
    }
    assert parse_data_reader_params("") == {}
    assert parse_data_reader_params(" k = v ;") == {"k": "v"}


def test_parse_errors():
    with pytest.raises(DataReaderError, match="'oops' is not key=value"):
        parse_data_reader_params("a=1; oops")
    with pytest.raises(DataReaderError, match="unterminated quote"):
        parse_data_reader_params('a="1')


def test_unknown_reader_type_lists_choices(tmp_path):
    with pytest.raises(
        DataReaderError,
        match="reader_type: unknown value 'ODPS'; choose one of " "RecordIO, CSV, Parquet",
    ):
        create_data_reader(str(tmp_path), reader_type="ODPS")


def test_reader_type_overrides_extension(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("a,b\n1,2\n")
    reader = create_data_reader(str(path), reader_type="csv")
    assert [s.end for s in reader.create_shards()] == [1]


def test_no_tensorflow_or_pyarrow_import():
    code = (
        "import sys, elasticdl.data.reader as r; r.create_data_reader('x.rio'); "
        "assert 'tensorflow' not in sys.modules and 'pyarrow' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": ":".join(sys.path)})
