"""Evaluation during training, step-based and time-based, and the metrics of each round.

Step-based (``--evaluation_steps``): when a PS reports a model version that is a multiple of
``evaluation_steps``, one evaluation task per validation range is queued, pinned to that
version. Time-based (``--evaluation_throttle_secs`` > 0, as in the original ElasticDL): the
master calls :meth:`EvaluationService.evaluate_if_time` with the newest model version it knows;
the first round starts no earlier than ``--evaluation_start_delay_secs`` after the service
started, then at most one every ``evaluation_throttle_secs`` (counted from each check that
found the time up, whether or not the model had changed since the last round); a version
already evaluated (or requested by the step trigger) is not evaluated again, and no round
starts once training is over (the final evaluation follows it). Both triggers may be on
together. Workers run the model on those records
and send back the raw model outputs and labels; the master aggregates the metrics of the model's
``eval_metrics_fn()`` and, once every task of that version is done, logs::

    Evaluation metrics[v=50]: {'accuracy': 0.8}

Metric outputs are counted exactly once per task: outputs are buffered per (task, worker) and
merged only when that worker's task result is accepted by the task manager, so a worker that dies
half-way through an evaluation task does not skew the metrics when another worker redoes it.

``eval_metrics_fn()`` returns ``{name: metric}`` (applied to the model's single output) or
``{output_name: {name: metric}}``; a metric is a ``keras.metrics.Metric`` instance or a function
``fn(labels, predictions)`` returning per-sample values (averaged). TensorFlow is imported only
when a Keras metric is actually updated.

Buffered outputs are not journaled (they are whole evaluation batches): a restarted master
evaluates every round left open again from scratch, so no metric mixes two masters' outputs.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Mapping

import numpy as np
from elasticdl.master.journal_ops import (
    EVALUATION_OPS,
    JournaledOwner,
    RoundDone,
    RoundStarted,
    VersionsSeen,
)
from elasticdl.master.task_manager import TaskManager
from elasticdl.master.tasks import Task, TaskType

logger = logging.getLogger(__name__)

FINAL_VERSION = -1  # "whatever the PS holds when the worker evaluates" (final / evaluate jobs)
DEFAULT_OUTPUT = "output"  # key a single-output model's predictions travel under


class EvaluationMetricsError(ValueError):
    """eval_metrics_fn returned something the master cannot aggregate."""


def _float32_repr(value: float) -> float:
    """The float a float32 metric really holds, printed short (0.21933334, not 0.2193333357...)."""
    return float(np.format_float_positional(np.float32(value), trim="-"))


class _FnMetric:
    """Mean of a per-sample metric function, accumulated in float64."""

    def __init__(self, fn: Callable[[Any, Any], Any]) -> None:
        self.fn = fn
        self.total = 0.0
        self.count = 0

    def update_state(self, labels, predictions) -> None:
        values = np.asarray(self.fn(labels, predictions), dtype=np.float64)
        self.total += float(values.sum())
        self.count += int(values.size)

    def result(self) -> float:
        return self.total / self.count if self.count else float("nan")


class MetricsAggregator:
    """Aggregates one round of evaluation (fresh metric objects from ``eval_metrics_fn()``)."""

    def __init__(self, metrics: Mapping[str, Any]) -> None:
        if not isinstance(metrics, Mapping) or not metrics:
            raise EvaluationMetricsError(
                "eval_metrics_fn must return a non-empty dict {name: metric} or "
                "{output_name: {name: metric}}"
            )
        nested = all(isinstance(v, Mapping) for v in metrics.values())
        if not nested and any(isinstance(v, Mapping) for v in metrics.values()):
            raise EvaluationMetricsError(
                "eval_metrics_fn mixes metrics and per-output dicts; use one form"
            )
        per_output = metrics if nested else {DEFAULT_OUTPUT: metrics}
        self._nested = nested
        self._metrics: dict[str, dict[str, Any]] = {}
        for output, group in per_output.items():
            self._metrics[output] = {}
            for name, metric in group.items():
                if hasattr(metric, "update_state") and hasattr(metric, "result"):
                    self._metrics[output][name] = metric
                elif callable(metric):
                    self._metrics[output][name] = _FnMetric(metric)
                else:
                    raise EvaluationMetricsError(
                        f"eval_metrics_fn: metric {name!r} is neither a keras Metric nor a function"
                    )

    def _outputs_for(self, output: str, model_outputs: Mapping[str, np.ndarray]) -> np.ndarray:
        if output in model_outputs:
            return model_outputs[output]
        if not self._nested and len(model_outputs) == 1:
            return next(iter(model_outputs.values()))
        raise EvaluationMetricsError(
            f"eval_metrics_fn expects model output {output!r}, but workers sent "
            f"{sorted(model_outputs)}"
        )

    def update(self, model_outputs: Mapping[str, np.ndarray], labels: np.ndarray) -> None:
        for output, group in self._metrics.items():
            predictions = self._outputs_for(output, model_outputs)
            for metric in group.values():
                metric.update_state(labels, predictions)

    def results(self) -> dict[str, float]:
        out = {}
        single = len(self._metrics) == 1
        for output, group in self._metrics.items():
            for name, metric in group.items():
                value = metric.result()
                key = name if single else f"{output}/{name}"
                out[key] = _float32_repr(float(np.asarray(value)))
        return out


@dataclasses.dataclass
class _Round:
    """One evaluation of one model version."""

    model_version: int
    pending: int  # tasks not yet done
    aggregator: MetricsAggregator
    failed_tasks: int = 0
    seen_versions: set[int] = dataclasses.field(default_factory=set)


@dataclasses.dataclass(frozen=True)
class EvaluationResult:
    model_version: int
    metrics: dict[str, float]
    failed_tasks: int = 0


class EvaluationTimer:
    """When a time-based evaluation is due: not before ``start_delay_secs`` after creation,
    then not within ``throttle_secs`` of the previous due time. ``clock`` is injectable."""

    def __init__(
        self,
        start_delay_secs: float,
        throttle_secs: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if throttle_secs <= 0:
            raise ValueError("throttle_secs must be > 0 (0 turns time-based evaluation off)")
        self._clock = clock
        self._throttle = throttle_secs
        self._earliest = clock() + start_delay_secs
        self._last: float | None = None

    def due(self) -> bool:
        """Whether the time is up; if so, the throttle counts from now."""
        now = self._clock()
        if now < self._earliest or (self._last is not None and now - self._last < self._throttle):
            return False
        self._last = now
        return True


class EvaluationService(JournaledOwner):
    OPS = EVALUATION_OPS

    def __init__(
        self,
        task_manager: TaskManager,
        eval_metrics_fn: Callable[[], Mapping[str, Any]],
        evaluation_steps: int = 0,
        final_evaluation: bool = True,
        start_delay_secs: float = 0.0,
        throttle_secs: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tm = task_manager
        self._eval_metrics_fn = eval_metrics_fn
        self.evaluation_steps = evaluation_steps
        self._timer_args = (start_delay_secs, throttle_secs, clock) if throttle_secs > 0 else None
        self._timer: EvaluationTimer | None = None
        self._running = False
        self._lock = threading.Lock()
        self._rounds: dict[int, _Round] = {}
        self._buffers: dict[tuple[int, int], list[tuple[dict, np.ndarray, int]]] = {}
        self._last_requested = 0
        self._model_version = 0
        self.history: list[EvaluationResult] = []
        self._listeners: list[Callable[[EvaluationResult], None]] = []
        self._finished_rounds: set[int] = set()
        self._final = (
            final_evaluation and task_manager.has_evaluation_data and task_manager.has_training
        )
        task_manager.add_done_listener(self._on_task_done)
        if self._final:
            task_manager.add_training_done_listener(lambda: self.start_evaluation(FINAL_VERSION))

    @property
    def model_version(self) -> int:
        """Latest model version reported by a PS (or seen in evaluation results)."""
        return self._model_version

    @property
    def latest(self) -> EvaluationResult | None:
        return self.history[-1] if self.history else None

    def add_result_listener(self, listener: Callable[[EvaluationResult], None]) -> None:
        self._listeners.append(listener)

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._rounds)

    # ---- life ------------------------------------------------------------------------------
    def start(self) -> None:
        """The job runs: the time-based trigger's delay counts from here."""
        if self._timer_args is not None:
            self._timer = EvaluationTimer(*self._timer_args)
        self._running = True
        logger.info("Evaluation service started")

    def stop(self) -> None:
        if self._running:
            self._running = False
            self._timer = None
            logger.info("Evaluation service stopped")

    # ---- triggers ------------------------------------------------------------------------
    def evaluate_if_time(self, model_version: int) -> bool:
        """Time-based trigger, called periodically by the master with the newest model version
        it knows. Returns whether a round was started."""
        timer = self._timer
        if timer is None or not timer.due():
            return False
        if not self._tm.has_evaluation_data or self._tm.training_finished:
            return False
        with self._lock:
            before = (self._model_version, self._last_requested)
            self._model_version = max(self._model_version, model_version)
            new = model_version > self._last_requested
            if new:
                self._last_requested = model_version
            self._record_version_locked(before)
        if not new:
            logger.debug("Time-based evaluation skipped: version %d was evaluated", model_version)
            return False
        return self.start_evaluation(model_version)

    def report_version(self, model_version: int) -> bool:
        """A PS reached ``model_version``; start an evaluation if it is due. Returns whether
        one was started."""
        with self._lock:
            before = (self._model_version, self._last_requested)
            self._model_version = max(self._model_version, model_version)
            due = (
                self.evaluation_steps > 0
                and model_version > 0
                and model_version % self.evaluation_steps == 0
                and model_version > self._last_requested
            )
            if due:
                self._last_requested = model_version
            self._record_version_locked(before)
        # Periodic evaluations only while training runs; the final one follows training.
        if not due or not self._tm.has_evaluation_data or self._tm.training_finished:
            return False
        return self.start_evaluation(model_version)

    def start_evaluation(self, model_version: int) -> bool:
        """Queue evaluation tasks for ``model_version`` (FINAL_VERSION = latest)."""
        num_tasks = self._tm.num_evaluation_tasks
        if num_tasks == 0:
            return False
        with self._lock:
            if model_version in self._rounds:
                return False
            # Register the round before its tasks exist so no result can arrive unannounced.
            self._rounds[model_version] = _Round(
                model_version, num_tasks, MetricsAggregator(self._eval_metrics_fn())
            )
            self._record(RoundStarted(model_version))
        self._tm.create_evaluation_tasks(model_version)
        logger.info(
            "Evaluation of model version %s started (%d tasks)", _v(model_version), num_tasks
        )
        return True

    # ---- results -------------------------------------------------------------------------
    def report_evaluation_metrics(
        self,
        model_outputs: Mapping[str, np.ndarray],
        labels: np.ndarray,
        worker_id: int,
        task_id: int = 0,
        model_version: int = -1,
    ) -> None:
        """Outputs of one evaluation minibatch. Buffered until the task is accepted."""
        outputs = {k: np.asarray(v) for k, v in model_outputs.items()}
        labels = np.asarray(labels)
        with self._lock:
            if model_version >= 0:
                before = (self._model_version, self._last_requested)
                self._model_version = max(self._model_version, model_version)
                self._record_version_locked(before)
            if task_id:
                self._buffers.setdefault((task_id, worker_id), []).append(
                    (outputs, labels, model_version)
                )
                return
            # Workers that do not name the task: merge right away into the only open round.
            if len(self._rounds) != 1:
                raise EvaluationMetricsError(
                    "evaluation metrics without task_id while several evaluations run; "
                    "workers must set ReportEvaluationMetricsRequest.task_id"
                )
            rnd = next(iter(self._rounds.values()))
            self._merge(rnd, [(outputs, labels, model_version)])

    def _merge(self, rnd: _Round, batches) -> None:
        for outputs, labels, version in batches:
            rnd.aggregator.update(outputs, labels)
            if version >= 0:
                rnd.seen_versions.add(version)

    def _on_task_done(self, task: Task, success: bool, worker_id: int) -> None:
        if task.type != TaskType.EVALUATION:
            return
        result = None
        with self._lock:
            batches = self._buffers.pop((task.task_id, worker_id), [])
            # Outputs other workers sent for this task before losing it are void.
            for key in [k for k in self._buffers if k[0] == task.task_id]:
                del self._buffers[key]
            rnd = self._rounds.get(task.model_version)
            if rnd is None:
                logger.warning(
                    "Result of evaluation %s for an unknown round ignored", task.describe()
                )
                return
            if success:
                self._merge(rnd, batches)
            else:
                rnd.failed_tasks += 1
            rnd.pending -= 1
            if rnd.pending == 0:
                del self._rounds[task.model_version]
                result = self._finish(rnd)
                self._finished_rounds.add(task.model_version)
                self._record(
                    RoundDone(
                        task.model_version,
                        result.model_version,
                        result.metrics,
                        result.failed_tasks,
                    )
                )
        if result is not None:
            for listener in self._listeners:
                listener(result)

    def _finish(self, rnd: _Round) -> EvaluationResult:
        version = rnd.model_version
        if version == FINAL_VERSION:
            version = max(rnd.seen_versions) if rnd.seen_versions else self._model_version
        metrics = rnd.aggregator.results()
        result = EvaluationResult(version, metrics, rnd.failed_tasks)
        self.history.append(result)
        if rnd.failed_tasks:
            logger.warning(
                "Evaluation of version %d: %d task(s) failed; metrics cover the rest",
                version,
                rnd.failed_tasks,
            )
        logger.info("Evaluation metrics[v=%d]: %s", version, metrics)
        return result

    # ---- journal ---------------------------------------------------------------------------
    def _record_version_locked(self, before: tuple[int, int]) -> None:
        if (self._model_version, self._last_requested) != before:
            self._record(VersionsSeen(self._model_version, self._last_requested))

    def replay(self, snapshot: dict | None, records: list[dict]) -> None:
        """Rebuild rounds, history and versions from the journal (rounds still open come
        back empty; ``resume_after_restart`` runs them again). The service writes no
        snapshots (its journal stays small), so ``snapshot`` is always None."""
        ops = self._decode(records)
        with self._lock:
            for op in ops:
                match op:
                    case RoundStarted(version):
                        self._rounds[version] = _Round(version, 0, None)  # type: ignore[arg-type]
                    case RoundDone(version, result_version, metrics, failed_tasks):
                        self._rounds.pop(version, None)
                        self._finished_rounds.add(version)
                        self.history.append(
                            EvaluationResult(result_version, dict(metrics), failed_tasks)
                        )
                    case VersionsSeen(version, last_requested):
                        self._model_version = max(self._model_version, version)
                        self._last_requested = max(self._last_requested, last_requested)

    def resume_after_restart(self) -> list[int]:
        """Start again every round the previous master left open (and the final one, if
        training ended without it); returns their versions."""
        with self._lock:
            open_rounds = sorted(self._rounds)
            self._rounds.clear()
            self._buffers.clear()
        if (
            self._final
            and self._tm.training_done_fired
            and FINAL_VERSION not in self._finished_rounds
            and FINAL_VERSION not in open_rounds
        ):
            open_rounds.append(FINAL_VERSION)
        for version in open_rounds:
            self._tm.drop_evaluation_round(version)
            logger.info("Evaluation of model version %s restarts after the master's", _v(version))
            self.start_evaluation(version)
        return open_rounds


def _v(version: int) -> str:
    return "latest" if version == FINAL_VERSION else str(version)
