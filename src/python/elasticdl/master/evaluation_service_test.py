import logging

import numpy as np
import pytest
from elasticdl.master.evaluation_service import (
    FINAL_VERSION,
    EvaluationMetricsError,
    EvaluationService,
    MetricsAggregator,
)
from elasticdl.master.task_manager import NO_MORE_TASKS, TaskManager, TaskManagerConfig, TaskType


def _keras_metrics():
    import keras

    return {"accuracy": keras.metrics.SparseCategoricalAccuracy()}


def _abs_error(labels, predictions):
    return np.abs(np.asarray(labels, np.float64) - np.asarray(predictions, np.float64)).reshape(-1)


def _probs(pred_classes, num_classes=3):
    out = np.full((len(pred_classes), num_classes), 0.1, np.float32)
    out[np.arange(len(pred_classes)), pred_classes] = 0.8
    return out


def _tm(**kw):
    return TaskManager(
        TaskManagerConfig(records_per_task=5, **kw),
        training_shards=[("train", 0, 20)],
        evaluation_shards=[("val", 0, 10)],
    )


def test_periodic_evaluation_with_keras_metric_logs_like_original(caplog):
    tm = _tm()
    es = EvaluationService(tm, _keras_metrics, evaluation_steps=50)
    train = tm.get(0)
    assert es.report_version(49) is False
    assert es.report_version(50) is True
    assert es.report_version(50) is False  # not twice
    e1, e2 = tm.get(1), tm.get(2)
    assert (e1.type, e1.model_version) == (TaskType.EVALUATION, 50)
    # Task 1: 4 of 5 correct; task 2: 4 of 5 correct -> 0.8.
    labels = np.array([0, 1, 2, 0, 1])
    es.report_evaluation_metrics({"output": _probs([0, 1, 2, 0, 0])}, labels, 1, e1.task_id, 50)
    es.report_evaluation_metrics(
        {"output": _probs([2, 1, 2, 0, 1])[:3]}, labels[:3], 2, e2.task_id, 50
    )
    es.report_evaluation_metrics({"output": _probs([0, 1])}, labels[3:], 2, e2.task_id, 50)
    assert es.latest is None
    tm.report(e1.task_id, True, 1)
    with caplog.at_level(logging.INFO, logger="elasticdl.master.evaluation_service"):
        tm.report(e2.task_id, True, 2)
    assert es.latest.model_version == 50
    assert es.latest.metrics == {"accuracy": 0.8}
    assert "Evaluation metrics[v=50]: {'accuracy': 0.8}" in caplog.text
    tm.report(train.task_id, True, 0)


def test_outputs_of_a_worker_that_lost_its_task_are_not_counted():
    tm = _tm()
    es = EvaluationService(tm, lambda: {"mae": _abs_error}, evaluation_steps=10)
    es.report_version(10)
    e1 = tm.get(1)
    # Worker 1 sends half of its outputs, then dies; worker 3 redoes the task.
    es.report_evaluation_metrics({"output": np.full(5, 100.0)}, np.zeros(5), 1, e1.task_id, 10)
    tm.recover_tasks(1)
    again = tm.get(3)
    assert again.task_id == e1.task_id
    es.report_evaluation_metrics({"output": np.full(5, 1.0)}, np.zeros(5), 3, e1.task_id, 10)
    tm.report(e1.task_id, True, 3)
    e2 = tm.get(3)
    es.report_evaluation_metrics({"output": np.full(5, 3.0)}, np.zeros(5), 3, e2.task_id, 10)
    tm.report(e2.task_id, True, 3)
    assert es.history[-1].metrics == {"mae": 2.0}


def test_final_evaluation_after_training_uses_reported_version():
    tm = _tm()
    es = EvaluationService(tm, lambda: {"mae": _abs_error}, evaluation_steps=0)
    seen = []
    es.add_result_listener(seen.append)
    trained = 0
    while True:
        t = tm.get(0)
        if t.type == TaskType.TRAINING:
            trained += 1
            tm.report(t.task_id, True, 0)
        elif t.type == TaskType.EVALUATION:
            assert t.model_version == FINAL_VERSION
            es.report_evaluation_metrics({"y": np.ones(5)}, np.zeros(5), 0, t.task_id, 77)
            tm.report(t.task_id, True, 0)
        else:
            assert t is NO_MORE_TASKS
            break
    assert trained == 4
    assert [(r.model_version, r.metrics) for r in seen] == [(77, {"mae": 1.0})]
    assert not es.busy


def test_nested_metrics_per_output_and_failed_task():
    tm = TaskManager(
        TaskManagerConfig(records_per_task=5, max_task_retries=0),
        evaluation_shards=[("val", 0, 10)],
    )
    es = EvaluationService(
        tm, lambda: {"a": {"mae": _abs_error}, "b": {"mae": _abs_error}}, evaluation_steps=0
    )
    assert es.start_evaluation(FINAL_VERSION)
    e1, e2 = tm.get(0), tm.get(1)
    es.report_evaluation_metrics(
        {"a": np.ones(5), "b": np.full(5, 2.0)}, np.zeros(5), 0, e1.task_id, 5
    )
    tm.report(e1.task_id, True, 0)
    tm.report(e2.task_id, False, 1, err_message="boom")  # dropped: no retries allowed
    result = es.latest
    assert result.metrics == {"a/mae": 1.0, "b/mae": 2.0} and result.failed_tasks == 1
    assert result.model_version == 5


def test_aggregator_validation_messages():
    with pytest.raises(EvaluationMetricsError, match="non-empty dict"):
        MetricsAggregator({})
    with pytest.raises(EvaluationMetricsError, match="mixes"):
        MetricsAggregator({"a": _abs_error, "b": {"x": _abs_error}})
    with pytest.raises(EvaluationMetricsError, match="neither"):
        MetricsAggregator({"a": 3})
    agg = MetricsAggregator({"out1": {"mae": _abs_error}, "out2": {"mae": _abs_error}})
    with pytest.raises(EvaluationMetricsError, match="expects model output 'out2'"):
        agg.update({"out1": np.ones(2)}, np.zeros(2))


# ---- time-based evaluation (--evaluation_start_delay_secs / --evaluation_throttle_secs) ------
class _Clock:
    """An injected monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _timed(clock, delay=100, throttle=30, **kw):
    tm = _tm(**kw)
    es = EvaluationService(
        tm, _keras_metrics, start_delay_secs=delay, throttle_secs=throttle, clock=clock
    )
    return tm, es


def _evaluation_versions(tm) -> list[int]:
    """Versions of the evaluation rounds queued so far, in order (2 tasks per round)."""
    versions: list[int] = []
    worker = 10
    while True:
        task = tm.get(worker)
        if task.type != TaskType.EVALUATION:
            return versions
        if task.model_version not in versions:
            versions.append(task.model_version)
        worker += 1


def test_time_based_evaluation_waits_for_the_delay_then_throttles(caplog):
    clock = _Clock()
    tm, es = _timed(clock, delay=100, throttle=30)
    with caplog.at_level(logging.INFO, logger="elasticdl.master.evaluation_service"):
        es.start()
    assert "Evaluation service started" in caplog.text
    clock.now += 99.9
    assert es.evaluate_if_time(5) is False  # before the start delay
    clock.now += 0.1
    assert es.evaluate_if_time(7) is True  # delay over: the newest version is evaluated
    clock.now += 29.9
    assert es.evaluate_if_time(12) is False  # throttled
    clock.now += 0.1
    assert es.evaluate_if_time(15) is True
    clock.now += 30
    # The time is up but the model has not changed: no round, and the throttle restarts.
    assert es.evaluate_if_time(15) is False
    clock.now += 10
    assert es.evaluate_if_time(20) is False
    clock.now += 20
    assert es.evaluate_if_time(20) is True
    assert _evaluation_versions(tm) == [7, 15, 20]
    with caplog.at_level(logging.INFO, logger="elasticdl.master.evaluation_service"):
        es.stop()
    assert "Evaluation service stopped" in caplog.text
    clock.now += 1000
    assert es.evaluate_if_time(99) is False  # stopped


def test_time_based_evaluation_is_off_without_throttle_and_before_start():
    clock = _Clock()
    tm, es = _timed(clock, delay=0, throttle=0)
    es.start()
    clock.now += 10_000
    assert es.evaluate_if_time(50) is False
    tm, es = _timed(clock, delay=0, throttle=5)
    assert es.evaluate_if_time(50) is False  # the service has not started
    es.start()
    assert es.evaluate_if_time(50) is True  # delay 0: at once


def test_time_based_and_step_based_triggers_never_evaluate_a_version_twice():
    clock = _Clock()
    tm = _tm()
    es = EvaluationService(
        tm, _keras_metrics, evaluation_steps=10, start_delay_secs=0, throttle_secs=5, clock=clock
    )
    es.start()
    assert es.report_version(10) is True
    assert es.evaluate_if_time(10) is False  # the step trigger took version 10
    clock.now += 5
    assert es.evaluate_if_time(13) is True
    assert es.report_version(20) is True
    clock.now += 5
    assert es.evaluate_if_time(20) is False
    assert _evaluation_versions(tm) == [10, 13, 20]


def test_no_time_based_evaluation_once_training_is_over():
    clock = _Clock()
    tm, es = _timed(clock, delay=0, throttle=1)
    es.start()
    worker = 0
    while True:  # train everything; the final evaluation (latest version) follows
        task = tm.get(worker)
        if task.type != TaskType.TRAINING:
            break
        tm.report(task.task_id, True, worker)
    assert tm.training_finished
    assert task.type == TaskType.EVALUATION and task.model_version == FINAL_VERSION
    clock.now += 100
    assert es.evaluate_if_time(40) is False
