"""The worker's main loop: ask the master for a task, run it, report, repeat.

TRAINING       train every minibatch of the shard through the PS; report records/batches.
EVALUATION     forward the shard with the newest parameters; send outputs + labels to the master,
               which computes the metrics of `eval_metrics_fn` for the task's model version.
PREDICTION     forward the shard; hand predictions to the model's PredictionOutputsProcessor.
TRAIN_END_CALLBACK  run callbacks' on_train_end, a SavedModelExporter (the model file's or
               the worker's) among them: the final model as a SavedModel at --output.
WAIT           nothing to do now (others finish the epoch): sleep and ask again.
NONE           the job has no more work: exit 0.

A task that fails is reported with its error (the master re-queues it) and the loop goes on;
only a run of consecutive failures, which means this worker cannot work at all, ends it.

Look-ahead (`prefetch_next_task`): while a small training task (one pipeline call, see
TaskDataService) trains, a background thread asks the master for the next task and, if it is a
small training task too, computes its minibatches, so neither the RPC nor the input pipeline
sits between two tasks' steps. The worker then owns two tasks at once (more with a lease of
tasks, see `MasterClient`), which the master already handles (a dead worker's tasks are all
re-queued); a WAIT answered ahead is dropped and asked
again after the report, so no work is skipped and task order is unchanged. A look-ahead that
gets back the task the loop is running (the master took both tasks back past
``--task_timeout``, e.g. while a PS was stopped) asks for another instead of running it twice.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from concurrent import futures
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import tensorflow as tf
from elasticdl.common.model_utils import Mode, ModelSpec
from elasticdl.common.types import JobType
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.worker.callbacks import SavedModelExporter
from elasticdl.worker.master_client import MasterClient
from elasticdl.worker.ps_trainer import PSRefusedModelError
from elasticdl.worker.task_data_service import TaskDataService
from elasticdl.worker.trainer import Trainer

logger = logging.getLogger(__name__)


@dataclass
class WorkerConfig:
    worker_id: int
    job_type: JobType = JobType.TRAINING_ONLY
    minibatch_size: int = 64
    log_loss_steps: int = 100
    output: str = ""  # default SavedModel path / prediction output directory
    wait_sleep_s: float = 1.5
    max_consecutive_failures: int = 5
    prefetch_next_task: bool = True  # fetch the next task and its data during training
    # How much lower the look-ahead thread's CPU priority is than the rest of the process
    # (added to its nice value; 0 keeps it equal). See _lower_this_threads_priority.
    look_ahead_nice: int = 10


class WorkerFailedError(RuntimeError):
    pass


def _num_examples(batch) -> int:
    first = tf.nest.flatten(batch)[0]
    if isinstance(first, tf.SparseTensor):  # its static batch size may be unknown
        return int(first.dense_shape[0])
    return int(first.shape[0]) if first.shape.rank else 1


def _with_last(items: Iterable) -> Iterator[Tuple[Any, bool]]:
    """(item, is it the last one?) for every item, looking one item ahead."""
    it = iter(items)
    try:
        current = next(it)
    except StopIteration:
        return
    for following in it:
        yield current, False
        current = following
    yield current, True


def _to_numpy_outputs(outputs) -> Dict[str, np.ndarray]:
    if isinstance(outputs, dict):
        return {k: np.asarray(v) for k, v in outputs.items()}
    return {"output": np.asarray(outputs)}


def _lower_this_threads_priority(delta: int) -> None:
    """Raise the calling thread's nice value by `delta` (Linux: nice is per thread, and the
    threads it creates inherit it, so the tf.data pool that computes the look-ahead's
    minibatches runs at the same priority).

    Why: the look-ahead only has to finish before the current task does, while everything
    waits for the training step and the PS's answer. At equal priority the scheduler shares
    the cores evenly between them, and parsing then delays every step it overlaps (the A/B
    figures are in benchmarks/runtime/README.md). A thread that is the only one runnable
    still gets the whole CPU, whatever its nice value."""
    if delta <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        tid = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + delta))
    except OSError as err:  # e.g. a sandbox without setpriority: keep the equal priority
        logger.debug("cannot lower the look-ahead thread's priority: %s", err)


class Worker:
    """The task loop of one worker process (see the module docstring).

    Round trips: one RPC per lease of tasks (`MasterClient`: the next task comes from the
    lease while it lasts, results wait for the next lease call), else per task,
    `report_and_get_task`, whose answer is the next task.
    Without a look-ahead the worker reports and gets its next task at once. With one, the
    next task is already fetched when a task ends, so its result waits (microseconds: until
    the next task starts) and travels with the following look-ahead's request, on that
    thread, while the next task trains. The master sees each result before it hands out the
    task after next, and the worker never holds more than the two tasks described above. A
    result that no look-ahead picks up right away (the next task is not a small training
    task, or the loop ends) is sent alone at once.
    """

    def __init__(
        self,
        config: WorkerConfig,
        spec: ModelSpec,
        master: MasterClient,
        trainer: Trainer,
        data: TaskDataService,
        ps_set=None,
    ):
        """``ps_set``: a ``worker.ps_set.PSSet`` (ParameterServerStrategy), which moves the
        trainer to a new PS set when a task says the job's PS count changed."""
        self.config = config
        self.ps_set = ps_set
        self.spec = spec
        self.master = master
        self.trainer = trainer
        self.data = data
        self._callbacks: Optional[List[Any]] = None
        self._processor = None
        self._stopped_training = False
        # (task, its minibatches or None) fetched by the look-ahead thread
        self._ahead: Optional[futures.Future] = None
        self._ahead_pool: Optional[futures.ThreadPoolExecutor] = None
        # The next task, answered by the master together with the last report.
        self._pending: Optional[pb.Task] = None
        # A task's result being reported on the look-ahead thread while the next task trains.
        self._report_future: Optional[futures.Future] = None
        # A successful task's (task_id, counters) waiting to ride with the next look-ahead.
        self._deferred_report: Optional[tuple] = None
        self._running_task_id = 0  # the task the loop runs now (read by the look-ahead)

    # ------------------------------------------------------------------ loop
    def run(self) -> int:
        try:
            return self._run()
        finally:
            try:  # finished tasks the master should not run again
                self._wait_for_report()
                self.master.flush_results()  # results waiting for the next lease call
            except Exception as err:  # noqa: BLE001 - already failing: keep the first error
                logger.warning("could not report the last finished tasks: %s", err)
            if self._ahead_pool is not None:
                self._ahead_pool.shutdown(wait=True)
                self._ahead_pool = None

    def _next_task(self) -> Tuple[pb.Task, Optional[list]]:
        """The task fetched ahead (with its minibatches when they were prepared), else ask."""
        pending, self._pending = self._pending, None
        if pending is not None:  # asked after the report: a WAIT here is current, keep it
            return pending, None
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            task, batches = ahead.result()  # an error here is the master's: propagate it
            if task.type != pb.WAIT:
                return task, batches
        self._wait_for_report()  # the master must know what this worker finished first
        return self.master.get_task(), None

    def _fetch_ahead(self, report: Optional[tuple] = None) -> Tuple[pb.Task, Optional[list]]:
        if report is not None:  # the previous task's result, in the same round trip
            task_id, counters = report
            task = self.master.report_and_get_task(task_id, "", counters)
        else:
            task = self.master.get_task()
        if task.task_id != 0 and task.task_id == self._running_task_id:
            # The master took back the task this worker is running (it ran past
            # --task_timeout) and handed it to us again: we will report it once it ends. A
            # second copy would train it twice, and its report, stale, would make the master
            # hand us the next task twice too, and so on.
            logger.info(
                "Task %d, which this worker runs, came back ahead: asking for another", task.task_id
            )
            task = self.master.get_task()
        pieces = self._pieces(task) if task.type == pb.TRAINING and task.task_id != 0 else None
        if pieces:
            try:
                return task, self._piece_minibatches(pieces[0])
            except Exception:  # noqa: BLE001 - run_task reads it again and reports the error
                logger.debug("look-ahead data of task %d failed", task.task_id, exc_info=True)
        return task, None

    def _pieces(self, task: pb.Task) -> Optional[List[pb.Shard]]:
        """The task's shard as pieces of one pipeline call each (one piece for a small task;
        `TaskDataService.pieces`), or None where the data service streams the task instead."""
        split = getattr(self.data, "pieces", None)
        shard = task.shard
        if (
            split is not None
            and (len(shard.indices) if shard.indices else shard.end - shard.start) > 0
        ):
            return split(shard)
        return [shard] if self._fits_one_call(task) else None

    def _piece_minibatches(self, piece: pb.Shard) -> list:
        return list(self.data.dataset(piece, Mode.TRAINING))

    def _piece_by_piece(self, first: list, rest: List[pb.Shard]) -> Iterator:
        """A task of several pieces: the minibatches of `first`, then of each piece of `rest`,
        each computed on the look-ahead thread while the one before it trains (so the input
        pipeline does not sit between a large task's steps either); the look-ahead for the
        next task starts when the last piece does."""
        current, pending = first, None
        try:
            for piece in rest:
                pending = self._pool().submit(self._piece_minibatches, piece)
                yield from current
                current, pending = pending.result(), None
            self._start_fetch_ahead()
            yield from current
        finally:
            if pending is not None:  # left mid-task: the pipeline is free once the piece is
                futures.wait([pending])

    def _fits_one_call(self, task: pb.Task) -> bool:
        shard = task.shard
        num = len(shard.indices) if shard.indices else shard.end - shard.start
        chunk = getattr(self.data, "chunk_records", 0)
        return 0 < num <= chunk

    def _start_fetch_ahead(self) -> None:
        if not self.config.prefetch_next_task or self._ahead is not None:
            self._send_deferred_report()
            return
        # The pool's one thread runs its jobs in order: a result sent alone before reaches the
        # master before this request (its error is raised by the next _wait_for_report).
        report, self._deferred_report = self._deferred_report, None
        self._ahead = self._pool().submit(self._fetch_ahead, report)

    def _pool(self) -> futures.ThreadPoolExecutor:
        if self._ahead_pool is None:
            self._ahead_pool = futures.ThreadPoolExecutor(
                1,
                thread_name_prefix="task-ahead",
                initializer=_lower_this_threads_priority,
                initargs=(self.config.look_ahead_nice,),
            )
        return self._ahead_pool

    def _send_deferred_report(self) -> None:
        """A result waiting for a look-ahead that will not come: send it alone, now (on the
        look-ahead thread, so it still reaches the master before that thread's next request)."""
        deferred, self._deferred_report = self._deferred_report, None
        if deferred is not None:
            self._wait_for_sent_report()
            task_id, counters = deferred
            self._report_future = self._pool().submit(
                self.master.report_task_result, task_id, "", counters
            )

    def _report(
        self,
        task_id: int,
        err_message: str = "",
        exec_counters=None,
        get_next: bool = True,
        fatal: bool = False,
    ) -> None:
        """Report a task's result; with `get_next` and no look-ahead in flight, also get the
        next task in the same call (kept in `_pending` for `_next_task`).

        With a look-ahead in flight, a success waits for the next look-ahead, which sends it
        with its request for a task (`report_and_get_task`) while the next task (already
        fetched) trains; see the module docstring. At most one result is outstanding (an
        earlier one is sent and waited for first, its error raised here)."""
        self._wait_for_report()
        if get_next and self._ahead is None:
            self._pending = self.master.report_and_get_task(task_id, err_message, exec_counters)
        elif self._ahead is not None and not err_message:
            self._deferred_report = (task_id, exec_counters)
        elif fatal:
            self.master.report_task_result(task_id, err_message, exec_counters, fatal=True)
        else:
            self.master.report_task_result(task_id, err_message, exec_counters)

    def _wait_for_report(self) -> None:
        """Until the master has every result this worker finished (a waiting one is sent)."""
        self._send_deferred_report()
        self._wait_for_sent_report()

    def _wait_for_sent_report(self) -> None:
        future, self._report_future = self._report_future, None
        if future is not None:
            future.result()  # a report that failed is the master's error: propagate it

    def _run(self) -> int:
        failures = 0
        while True:
            task, batches = self._next_task()
            if task.type == pb.WAIT:
                # An AllReduce member keeps stepping (without data) so the others are not
                # blocked waiting for it; everyone else just sleeps.
                if not self.trainer.idle_step():
                    time.sleep(self.config.wait_sleep_s)
                continue
            if task.task_id == 0 or task.type == pb.NONE:
                self._wait_for_report()
                logger.info("Worker %d: no more tasks, exiting", self.config.worker_id)
                self.trainer.leave()  # AllReduce: leave the group
                return 0
            self._running_task_id = task.task_id
            try:
                if self.ps_set is not None:
                    self.ps_set.follow(task)
                counters = self.run_task(task, batches)
            except Exception as err:  # report, let the master re-queue, go on
                failures += 1
                msg = f"{type(err).__name__}: {err}"
                logger.error("Task %d failed: %s\n%s", task.task_id, msg, traceback.format_exc())
                # No retry can fix a refused model: the master fails the job with its line.
                fatal = isinstance(err, PSRefusedModelError)
                give_up = fatal or failures >= self.config.max_consecutive_failures
                # Take no new task when giving up: the master would wait for this worker.
                self._report(task.task_id, err_message=msg, get_next=not give_up, fatal=fatal)
                if give_up:
                    raise WorkerFailedError(
                        f"{failures} tasks failed in a row, last: {msg}"
                    ) from err
                continue
            failures = 0
            self._report(task.task_id, exec_counters=counters)

    def run_task(self, task: pb.Task, batches: Optional[list] = None) -> Dict[str, int]:
        if task.type == pb.TRAINING:
            return self.train_task(task, batches)  # its look-ahead carries a waiting result
        self._send_deferred_report()
        if task.type == pb.EVALUATION:
            return self.evaluate_task(task)
        if task.type == pb.PREDICTION:
            return self.predict_task(task)
        if task.type == pb.TRAIN_END_CALLBACK:
            return self.train_end_task(task)
        raise ValueError(f"unknown task type {task.type}")

    # ------------------------------------------------------------------ callbacks
    def callbacks(self) -> List[Any]:
        if self._callbacks is None:
            cbs = list(self.spec.callbacks() or []) if self.spec.callbacks else []
            for cb in cbs:
                cb.set_model(self.trainer.model)
            self._callbacks = cbs
        return self._callbacks

    # ------------------------------------------------------------------ tasks
    def train_task(self, task: pb.Task, minibatches: Optional[list] = None) -> Dict[str, Any]:
        if self._stopped_training:
            # MaxStepsStopping fired: acknowledge the rest of the data without training.
            self._send_deferred_report()
            return {
                "records": 0,
                "batches": 0,
                "skipped_records": task.shard.end - task.shard.start,
            }
        pieces = self._pieces(task)
        given = minibatches is not None  # by the look-ahead: the first piece's
        if not given:
            self._send_deferred_report()  # not kept waiting while this task's data is read
            if pieces is None:
                minibatches = self.data.dataset(task.shard, Mode.TRAINING)
            else:  # computed at once: the pipeline is free again
                minibatches = self._piece_minibatches(pieces[0])
        piecewise = None
        if pieces is not None and len(pieces) > 1:
            self._send_deferred_report()  # the look-ahead starts only with the last piece
            minibatches = piecewise = self._piece_by_piece(minibatches, pieces[1:])
        elif pieces is not None or given:
            self._start_fetch_ahead()
        try:
            try:
                records, batches, loss_sum = self._train_minibatches(minibatches)
            finally:
                if piecewise is not None:
                    piecewise.close()  # waits for a piece still being computed
            # Done only once the PS have every push of the task: a push that fails here fails
            # the task, which the master then runs again.
            self.trainer.wait_for_pushes()
        except Exception:
            try:  # a push still in flight belongs to this failed task, not to the next one
                self.trainer.wait_for_pushes()
            except Exception as err:  # noqa: BLE001 - the task's own error is the one to report
                logger.info("a push of the failed task failed too: %s", err)
            raise
        # A task that ended before its last push (stopped above) sends the state it trained
        # alone; after a normal end this sends nothing. Not reached when a step raised.
        self.trainer.deliver_state()
        # The master shows this version in the job status (it is not summed like the rest), and
        # the task's mean loss on its loss curve.
        version = self.trainer.model_version
        result = {"records": records, "batches": batches, "model_version": version}
        if batches:
            result["loss"] = loss_sum / batches
        return result

    def _train_minibatches(self, minibatches) -> Tuple[int, int, float]:
        """Train a task's minibatches: (records, minibatches, sum of their losses)."""
        records = batches = 0
        loss_sum = 0.0
        for (features, labels), last in _with_last(minibatches):
            self.trainer.ensure_model(features)
            version = self.trainer.model_version
            for cb in self.callbacks():
                cb.on_train_batch_begin(version)
            if self._callbacks:
                self.trainer.learning_rate_may_have_changed()
            # The task's last push carries the model's non-trainable state to the PS.
            loss = self.trainer.train_minibatch(features, labels, send_state=last)
            records += _num_examples(labels)
            batches += 1
            loss_sum += float(loss)
            if self._callbacks:
                # Callbacks may read the weights and the model version (MaxStepsStopping): the
                # PS's answer to this step's push first, then what it brought back. With an
                # async PS this gives up the push's overlap with the next step.
                self.trainer.wait_for_pushes()
                self.trainer.flush_pending_assign()
            for cb in self.callbacks():
                cb.on_train_batch_end(self.trainer.model_version, {"loss": loss})
            steps = self.trainer.steps
            if self.config.log_loss_steps > 0 and (
                steps == 1 or steps % self.config.log_loss_steps == 0
            ):
                logger.info("Loss = %s, steps = %d", loss, steps)
            if getattr(self.trainer.model, "stop_training", False):
                self._stopped_training = True
                break
        return records, batches, loss_sum

    def evaluate_task(self, task: pb.Task) -> Dict[str, int]:
        outputs: Dict[str, List[np.ndarray]] = {}
        labels_all: List[np.ndarray] = []
        pulled = False
        for features, labels in self.data.dataset(task.shard, Mode.EVALUATION):
            self.trainer.ensure_model(features)
            if not pulled:
                self.trainer.pull_model()
                pulled = True
            for name, value in _to_numpy_outputs(self.trainer.forward(features)).items():
                outputs.setdefault(name, []).append(value)
            labels_all.append(np.asarray(labels))
        if not labels_all:
            return {"records": 0, "batches": 0}
        model_outputs = {k: np.concatenate(v) for k, v in outputs.items()}
        labels = np.concatenate(labels_all)
        # The version actually evaluated (the master files results under the task's round).
        self.master.report_evaluation_metrics(
            model_outputs, labels, self.trainer.model_version, task.task_id
        )
        return {"records": int(labels.shape[0]), "batches": len(labels_all)}

    def _prediction_processor(self):
        if self._processor is None and self.spec.prediction_outputs_processor is not None:
            p = self.spec.prediction_outputs_processor
            self._processor = p() if isinstance(p, type) else p
        return self._processor

    def predict_task(self, task: pb.Task) -> Dict[str, int]:
        records = batches = 0
        pulled = False
        for features in self.data.dataset(task.shard, Mode.PREDICTION):
            if isinstance(features, tuple) and len(features) == 2:
                features = features[0]  # feed returned (features, labels) anyway
            self.trainer.ensure_model(features)
            if not pulled:
                self.trainer.pull_model()
                pulled = True
            predictions = self.trainer.forward(features)
            processor = self._prediction_processor()
            if processor is not None:
                # The model's outputs as they come (eager tensors), as the original ElasticDL
                # handed them: processors written for it call `predictions.numpy()`.
                processor.process(predictions, self.config.worker_id)
            else:
                self._write_predictions(task, tf.nest.map_structure(np.asarray, predictions))
            records += _num_examples(features)
            batches += 1
        return {"records": records, "batches": batches}

    def _write_predictions(self, task: pb.Task, preds) -> None:
        """Without a PredictionOutputsProcessor: append rows to <output>/predictions-worker-N.csv."""
        if not self.config.output:
            logger.warning(
                "Task %d: predictions dropped: the model has no "
                "PredictionOutputsProcessor and --output is empty",
                task.task_id,
            )
            return
        os.makedirs(self.config.output, exist_ok=True)
        path = os.path.join(self.config.output, f"predictions-worker-{self.config.worker_id}.csv")
        arrays = preds.values() if isinstance(preds, dict) else [preds]
        flat = np.concatenate([np.asarray(a).reshape(len(a), -1) for a in arrays], axis=1)
        with open(path, "a") as f:
            np.savetxt(f, flat, delimiter=",", fmt="%.7g")

    def train_end_task(self, task: pb.Task) -> Dict[str, int]:
        path = task.extended_config.get("saved_model_path") or self.config.output
        if not self.trainer.ensure_model_without_data():
            raise RuntimeError(
                "cannot export: this worker never saw data and the model has "
                "no declared inputs (subclassed model)"
            )
        callbacks = self.callbacks()
        if not any(isinstance(cb, SavedModelExporter) for cb in callbacks):
            # Not kept in self._callbacks: an exporter there would make every step run the
            # per-batch callback work for a callback that only acts at the end.
            callbacks = [SavedModelExporter()] + callbacks
        for cb in callbacks:
            if isinstance(cb, SavedModelExporter):
                cb.bind(self.trainer.export_saved_model, path)
            cb.on_train_end()
        return {}
