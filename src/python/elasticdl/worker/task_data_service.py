"""Turns a task's shard `[start, end)` into minibatches of `(features, labels)`.

Records come from the data reader as raw values (bytes for RecordIO, lines for CSV); the model
file's `feed(dataset, mode, metadata)` maps the record dataset to `(features, labels)` (or to
features for prediction), and the worker batches *after* feed, as the original ElasticDL does,
so `feed` parses one record at a time.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional

import tensorflow as tf
from elasticdl.common.cpu_budget import available_cpus, split_for_training
from elasticdl.common.model_utils import Mode, ModelSpec
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.worker.batched_feed import BatchedFeed, failure_reason, quiet_tf_logger, same_values

logger = logging.getLogger(__name__)


def _default_reader_factory(data_origin: str, records_per_task=None, **params):
    from elasticdl.data.reader import create_data_reader

    return create_data_reader(data_origin, records_per_task=records_per_task, **params)


class TaskDataService:
    def __init__(
        self,
        spec: ModelSpec,
        minibatch_size: int,
        data_reader_params: Optional[Dict[str, Any]] = None,
        reader_factory: Optional[Callable[..., Any]] = None,
        training_threads: Optional[int] = None,
    ):
        self.spec = spec  # minibatch_size > 0: the worker's spec checked it (replica_spec)
        self.minibatch_size = int(minibatch_size)
        self.params = dict(data_reader_params or {})
        # A model's own reader wins over the built-in ones (same rule as on the master).
        self._factory = reader_factory or spec.custom_data_reader or _default_reader_factory
        self._readers: Dict[str, Any] = {}
        self._pipelines: Dict[tuple, _Pipeline] = {}
        # (mode, kind of file) -> whether its feed runs batched (True), per record (False),
        # or is not checked yet (absent)
        self._batched_feed: Dict[tuple, bool] = {}
        self._current: Dict[tuple, pb.Shard] = {}  # the shard each pipeline reads next
        # Training pipelines run beside the compiled step (the worker's look-ahead computes the
        # next task's minibatches while the current one trains): on a thread pool of their own
        # with their share of the CPUs (elasticdl.common.cpu_budget), so the step keeps the
        # rest instead of competing with tf.data's shared pool.
        self.training_threads = training_threads or split_for_training(available_cpus()).data

    def reader_for(self, shard_name: str):
        reader = self._readers.get(shard_name)
        if reader is None:
            reader = self._factory(data_origin=shard_name, records_per_task=None, **self.params)
            self._readers[shard_name] = reader
        return reader

    def records(self, shard: pb.Shard) -> Iterator:
        reader = self.reader_for(shard.name)
        if shard.indices:
            # Shuffled record indices within [start, end): read the range once, then pick.
            rows = list(reader.read_records(shard.name, shard.start, shard.end))
            for i in shard.indices:
                yield rows[i - shard.start]
        else:
            yield from reader.read_records(shard.name, shard.start, shard.end)

    def dataset(self, shard: pb.Shard, mode: Mode) -> Iterator:
        """The minibatches of ``shard``, in order; iterate the result once, before the next call.

        Two costs dominate small tasks, and both are paid once per (file, mode) instead of
        once per task:

        * Building a pipeline traces ``feed``'s functions (longer than training a
          two-minibatch task, and it holds the GIL the training step needs): one pipeline
          per (mode, kind of file) is built once and re-run for every task; its source yields
          the records of the shard most recently asked for, all as one tensor (one Python
          call per task instead of one per record), split into records again. Files of one
          kind (same reader class, record type and metadata: the shards of one dataset) give
          ``feed`` the same input, so they share the pipeline.
        * Iterating a dataset eagerly costs an iterator and thread hand-offs per minibatch
          (tens of ms on a busy machine with few cores). The pipeline batches ``CHUNK_MINIBATCHES``
          minibatches at once; a task that fits in one chunk is computed in a single call
          (``get_single_element``) and sliced into minibatches here, which is exactly what
          ``batch(minibatch_size)`` of the same stream would give.

        A third is ``feed``'s own per-record cost in tf.data: where ``feed`` is a chain of
        maps, the pipeline runs them once over a chunk of records (``batched_feed``), after
        checking on the first single-call task that the vectorized maps give exactly what the
        same maps give record by record (the feed's shuffles left out of both; else it stays
        per record, for good, and says why in the log).
        """
        num_records = len(shard.indices) if shard.indices else shard.end - shard.start
        if num_records <= 0:
            return iter(())
        stream = num_records > self.chunk_records
        key = self._pipeline_key(shard.name, mode) + (stream,)
        pipeline = self._pipelines.get(key)
        if pipeline is None:
            pipeline = self._pipelines[key] = self._build_pipeline(shard.name, mode, key, stream)
        self._current[key] = shard
        feed_key = key[:-1]
        checked = self._batched_feed.get(feed_key)
        if checked and pipeline.batched is not None:
            if stream:
                return self._minibatches_of_chunks(iter(pipeline.batched))
            return self._minibatches_of_chunks([pipeline.batched.get_single_element()])
        if stream:
            return self._minibatches_of_chunks(iter(pipeline.per_record))
        try:
            chunk = pipeline.per_record.get_single_element()
        except tf.errors.InvalidArgumentError as err:
            if "empty" in str(err).lower():  # feed dropped every record of the task
                return iter(())
            raise
        if checked is None and pipeline.check is not None:
            self._check_batched_feed(feed_key, pipeline.check)
        return self._minibatches_of_chunks([chunk])

    def _check_batched_feed(self, feed_key: tuple, check: "_Check") -> None:
        """Use the batched feed from now on if its maps give, for this task's records, what
        they give record by record."""
        try:
            want = check.per_record.get_single_element()
            same = same_values(check.batched.get_single_element(), want)
            why = "" if same else "its values differ from the per-record feed's"
        except Exception as err:  # noqa: BLE001 - any failure keeps the per-record feed
            same, why = False, failure_reason(err)
        self._settle_feed(feed_key, same, why)

    def _settle_feed(self, feed_key: tuple, batched: bool, why: str = "") -> None:
        """Record for good whether (mode, kind of file)'s feed runs batched, and say so."""
        self._batched_feed[feed_key] = batched
        if batched:
            logger.info("feed (%s) runs on whole chunks of records, vectorized", feed_key[0].value)
        else:
            logger.info("feed (%s) runs record by record: %s", feed_key[0].value, why)

    def pieces(self, shard: pb.Shard) -> List[pb.Shard]:
        """``shard`` as consecutive shards of at most ``chunk_records`` records each, whose
        records in order are the shard's: a task larger than one pipeline call trains piece
        by piece, the next piece computed while one trains (``Worker.train_task``). A piece of
        shuffled indices reads only the range its own indices span."""
        chunk = self.chunk_records
        if shard.indices:
            indices = list(shard.indices)
            if len(indices) <= chunk:
                return [shard]
            parts = [indices[i : i + chunk] for i in range(0, len(indices), chunk)]
            return [
                pb.Shard(name=shard.name, start=min(part), end=max(part) + 1, indices=part)
                for part in parts
            ]
        if shard.end - shard.start <= chunk:
            return [shard]
        return [
            pb.Shard(name=shard.name, start=start, end=min(start + chunk, shard.end))
            for start in range(shard.start, shard.end, chunk)
        ]

    @property
    def chunk_records(self) -> int:
        return self.minibatch_size * CHUNK_MINIBATCHES

    def _minibatches_of_chunks(self, chunks) -> Iterator:
        for chunk in chunks:
            n = _batch_size(chunk)
            for start in range(0, n, self.minibatch_size):
                stop = min(n, start + self.minibatch_size)
                yield tf.nest.map_structure(lambda t: _slice(t, start, stop), chunk)

    def _pipeline_key(self, shard_name: str, mode: Mode) -> tuple:
        reader = self.reader_for(shard_name)
        return (
            mode,
            type(reader).__module__,
            type(reader).__qualname__,
            repr(self._out_type(reader)),
            repr(getattr(reader, "metadata", None)),
        )

    @staticmethod
    def _out_type(reader):
        return getattr(reader, "records_output_types", tf.string) or tf.string

    def _build_pipeline(self, shard_name: str, mode: Mode, key: tuple, stream: bool) -> "_Pipeline":
        """`stream`: iterated chunk by chunk (a task of several chunks), so the next chunk is
        computed ahead while the worker trains on one; otherwise computed in one call, where a
        prefetch would only add a hand-off to its own thread (a tenth of the task's CPU time
        on the README model)."""
        reader = self.reader_for(shard_name)
        out_type = self._out_type(reader)
        chunk = self.chunk_records

        def task_chunks():
            rows = list(self.records(self._current[key]))
            for start in range(0, len(rows), chunk):
                yield rows[start : start + chunk]

        chunks = tf.data.Dataset.from_generator(
            task_chunks, output_signature=tf.TensorSpec((None,), out_type)
        )
        records = chunks.unbatch()
        if self.spec.feed is None:
            return _Pipeline(per_record=self._finish(records.batch(chunk), mode, stream))
        fed = self.spec.feed(records, mode, getattr(reader, "metadata", None))
        pipeline = _Pipeline(per_record=self._finish(fed.batch(chunk), mode, stream))
        found = self._batched_maps(chunks, fed, records, key[:-1])
        if found is not None:
            feed_fn, mapped = found
            batched = feed_fn.shuffle(mapped.unbatch()).batch(chunk) if feed_fn.shuffles else mapped
            pipeline.batched = self._finish(batched, mode, stream)
            if not stream and self._batched_feed.get(key[:-1]) is None:
                # Only a single-call task runs the check, and only until the feed is settled.
                pipeline.check = _Check(
                    per_record=self._finish(records.map(feed_fn.one).batch(chunk), mode, False),
                    batched=self._finish(mapped, mode, False),
                )
        return pipeline

    def _batched_maps(self, chunks, fed, records, feed_key: tuple):
        """(the feed's BatchedFeed, `chunks` through its vectorized maps), or None where the
        feed stays per record."""
        if self._batched_feed.get(feed_key) is False:
            return None
        feed_fn, why = BatchedFeed.of(fed, records)
        if feed_fn is not None:
            try:
                with quiet_tf_logger():
                    return feed_fn, chunks.map(feed_fn)  # traced (and vectorized) here
            except Exception as err:  # noqa: BLE001 - what pfor cannot vectorize stays per record
                why = failure_reason(err)
        self._settle_feed(feed_key, False, why)
        return None

    def _finish(self, ds: tf.data.Dataset, mode: Mode, stream: bool) -> tf.data.Dataset:
        if stream:
            ds = ds.prefetch(1)
        if mode == Mode.TRAINING:
            options = tf.data.Options()
            options.threading.private_threadpool_size = self.training_threads
            options.threading.max_intra_op_parallelism = 1
            ds = ds.with_options(options)
        return ds


@dataclass
class _Check:
    """The feed's maps record by record and over the chunk, both without its shuffles: what
    the first task compares."""

    per_record: tf.data.Dataset
    batched: tf.data.Dataset


@dataclass
class _Pipeline:
    """One (mode, kind of file, streamed or not) pipeline: the model's feed record by record,
    and the same feed over whole chunks where it can run so (else None)."""

    per_record: tf.data.Dataset
    batched: Optional[tf.data.Dataset] = None
    check: Optional[_Check] = None


# Minibatches computed by one pipeline call (a task of at most this many is one call).
CHUNK_MINIBATCHES = 32


def _batch_size(chunk) -> int:
    first = tf.nest.flatten(chunk, expand_composites=False)[0]
    if isinstance(first, tf.SparseTensor):
        return int(first.dense_shape[0])
    return int(first.shape[0]) if first.shape.rank else 1


def _slice(t, start: int, stop: int):
    if isinstance(t, tf.SparseTensor):
        return tf.sparse.slice(
            t, [start] + [0] * (t.shape.rank - 1), [stop - start] + list(t.dense_shape[1:])
        )
    return t[start:stop]
