import pytest
from elasticdl.master.evaluation_service import EvaluationResult
from elasticdl.master.tensorboard_writer import TensorBoardError, TensorBoardWriter

pytest.importorskip("tensorboard")


def _read(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return events


def test_loss_and_metrics_are_scalars_tensorboard_reads(tmp_path):
    log_dir = tmp_path / "tb" / "run"  # created by the writer
    writer = TensorBoardWriter(str(log_dir))
    for version, loss in ((1, 2.5), (3, 1.25), (2, 1.5), (4, float("nan")), (5, 0.75)):
        writer.add_loss(version, loss)
    writer.add_evaluation(EvaluationResult(3, {"accuracy": 0.5, "out2/auc": 0.625}))
    writer.add_evaluation(EvaluationResult(5, {"accuracy": 0.75, "out2/auc": 0.875}))
    writer.close()
    writer.add_loss(6, 0.5)  # after close: ignored, no error
    events = _read(log_dir)
    assert set(events.Tags()["scalars"]) == {"loss", "accuracy", "out2/auc"}
    # Steps are model versions, in arrival order; a NaN loss leaves a gap.
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [
        (1, 2.5),
        (3, 1.25),
        (2, 1.5),
        (5, 0.75),
    ]
    assert [(e.step, e.value) for e in events.Scalars("accuracy")] == [(3, 0.5), (5, 0.75)]
    assert [(e.step, e.value) for e in events.Scalars("out2/auc")] == [(3, 0.625), (5, 0.875)]


def test_a_restarted_master_adds_a_file_to_the_same_run(tmp_path):
    first = TensorBoardWriter(str(tmp_path))
    first.add_loss(1, 1.0)
    first.close()
    second = TensorBoardWriter(str(tmp_path))
    second.add_loss(2, 0.5)
    second.close()
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    assert [e.step for e in _read(tmp_path).Scalars("loss")] == [1, 2]


def test_a_directory_that_cannot_be_written_is_one_line_naming_the_flag(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(TensorBoardError) as info:
        TensorBoardWriter(str(tmp_path / "afile" / "tb"))
    message = str(info.value)
    assert message.startswith("--tensorboard_log_dir ") and "\n" not in message
    assert "choose a writable directory" in message
