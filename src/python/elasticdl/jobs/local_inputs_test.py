"""A local job's data is checked on this machine before it is submitted (the CLI's side of it:
tests/python/elasticdl_tests/bad_inputs, rows training-data-*)."""

from __future__ import annotations

import pytest
from elasticdl.common.job_spec import JobSpec
from elasticdl.common.spec_codec import SpecError
from elasticdl.data.recordio import Writer
from elasticdl.jobs.local_inputs import check_local_inputs


@pytest.fixture
def zoo(tmp_path):
    (tmp_path / "zoo" / "m").mkdir(parents=True)
    (tmp_path / "zoo" / "m" / "model.py").write_text("def custom_model():\n    pass\n")
    return tmp_path / "zoo"


def _spec(zoo, **values) -> JobSpec:
    return JobSpec(job_name="j", model_zoo=str(zoo), model_def="m.model.custom_model", **values)


def _shard(path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with Writer(str(path)) as writer:
        writer.write(b"record")
    return str(path)


def test_recordio_shards_and_empty_ones_pass(zoo, tmp_path):
    _shard(tmp_path / "train" / "data-0.rio")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "data-0.rio").write_bytes(b"")  # the master reads no records there
    check_local_inputs(
        _spec(
            zoo,
            training_data=str(tmp_path / "train"),
            validation_data=_shard(tmp_path / "test.rio"),
            prediction_data=str(tmp_path / "empty"),
        )
    )


def _text_dir(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "README").write_text("text")
    return tmp_path / "t"


def _text_file(tmp_path):
    (tmp_path / "x").write_text("text")
    return tmp_path / "x"


@pytest.mark.parametrize(
    "field, make, says",
    [
        ("training_data", lambda d: d / "nothing", "does not exist on this machine"),
        ("training_data", _text_dir, "holds no RecordIO file"),
        ("validation_data", _text_file, "is not a RecordIO file"),
    ],
)
def test_what_the_master_cannot_read_is_one_line_naming_the_flag(zoo, tmp_path, field, make, says):
    with pytest.raises(SpecError) as refused:
        check_local_inputs(_spec(zoo, **{field: str(make(tmp_path))}))
    message = str(refused.value)
    assert message.startswith(f"--{field} ") and says in message and "\n" not in message


def test_other_readers_need_only_the_data_to_exist(zoo, tmp_path):
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "part.csv").write_text("a,b\n1,2\n")
    check_local_inputs(_spec(zoo, training_data=str(tmp_path / "csv")))  # CSV by file names
    (tmp_path / "table").mkdir()
    (tmp_path / "table" / "part-0").write_text("a,b\n1,2\n")
    named = _spec(zoo, training_data=str(tmp_path / "table"), data_reader_params="reader_type=CSV")
    check_local_inputs(named)
    check_local_inputs(_spec(zoo, training_data="s3://bucket/train"))  # the reader's business


def test_a_model_with_its_own_reader_reads_anything(zoo, tmp_path):
    (zoo / "m" / "model.py").write_text(
        "def custom_model():\n    pass\n\n\ndef custom_data_reader(origin, records_per_task):\n"
        "    pass\n"
    )
    check_local_inputs(_spec(zoo, training_data="project.table"))
    with pytest.raises(SpecError, match="--training_data 'project.table' does not exist"):
        check_local_inputs(
            _spec(zoo, training_data="project.table", custom_data_reader="table_reader")
        )
