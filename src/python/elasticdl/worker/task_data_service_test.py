"""TaskDataService re-iterates one pipeline per (mode, kind of file): each task must still get
exactly its own records, in any order of files and modes, including empty ranges and shuffled
indices."""
import numpy as np
from elasticdl.common.model_utils import Mode, ModelSpec
from elasticdl.data import recordio
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.worker.task_data_service import TaskDataService


def _feed(dataset, mode, metadata):
    import tensorflow as tf

    ds = dataset.map(lambda r: tf.strings.to_number(r, tf.int64))
    if mode == Mode.PREDICTION:
        return ds
    return ds.map(lambda x: (x, x * 10))


def _spec():
    return ModelSpec(
        module=None, model_fn=None, loss=None, optimizer=None, feed=_feed, eval_metrics_fn=None
    )


def _write(path, values):
    with recordio.Writer(str(path)) as w:
        for v in values:
            w.write(str(v).encode())
    return str(path)


def _labels(service, shard, mode):
    out = []
    for batch in service.dataset(shard, mode):
        labels = batch[1] if isinstance(batch, tuple) else batch
        out.extend(np.asarray(labels).tolist())
    return out


def test_each_task_gets_exactly_its_records(tmp_path):
    a = _write(tmp_path / "a.rio", range(100))
    b = _write(tmp_path / "b.rio", range(1000, 1050))
    service = TaskDataService(_spec(), minibatch_size=8)
    assert _labels(service, pb.Shard(name=a, start=0, end=20), Mode.TRAINING) == [
        10 * i for i in range(20)
    ]
    assert _labels(service, pb.Shard(name=b, start=5, end=9), Mode.TRAINING) == [
        10 * i for i in range(1005, 1009)
    ]
    assert _labels(service, pb.Shard(name=a, start=20, end=37), Mode.TRAINING) == [
        10 * i for i in range(20, 37)
    ]
    assert _labels(service, pb.Shard(name=a, start=50, end=50), Mode.TRAINING) == []
    assert _labels(service, pb.Shard(name=a, start=90, end=100), Mode.EVALUATION) == [
        10 * i for i in range(90, 100)
    ]
    assert _labels(
        service, pb.Shard(name=a, start=0, end=10, indices=[3, 1, 3]), Mode.EVALUATION
    ) == [30, 10, 30]
    assert _labels(service, pb.Shard(name=b, start=0, end=3), Mode.PREDICTION) == [1000, 1001, 1002]
    # One pipeline per mode, built once and re-iterated: both RecordIO files share it.
    assert len(service._pipelines) == 3


def test_files_whose_metadata_differs_get_their_own_pipeline(tmp_path):
    from elasticdl.data.reader.base import Metadata
    from elasticdl.data.reader.recordio_reader import RecordIODataReader

    columns = {}

    class Reader(RecordIODataReader):
        @property
        def metadata(self):
            return Metadata(column_names=columns[self.data_origin])

    def feed(dataset, mode, metadata):  # the label says which metadata feed saw
        import tensorflow as tf

        tag = 1 if metadata.column_names == ["x"] else 2
        return dataset.map(lambda r: (tf.strings.to_number(r, tf.int64), tf.constant(tag)))

    a = _write(tmp_path / "a.rio", range(10))
    b = _write(tmp_path / "b.rio", range(10))
    c = _write(tmp_path / "c.rio", range(10))
    columns.update({a: ["x"], b: ["y"], c: ["x"]})
    spec = _spec()
    spec.feed = feed
    service = TaskDataService(spec, minibatch_size=4, reader_factory=Reader)
    for name, tag in ((a, 1), (b, 2), (c, 1), (b, 2)):
        assert _labels(service, pb.Shard(name=name, start=0, end=5), Mode.TRAINING) == [tag] * 5
    assert len(service._pipelines) == 2  # a and c share one, b has its own


def test_minibatches_of_a_task(tmp_path):
    a = _write(tmp_path / "a.rio", range(30))
    service = TaskDataService(_spec(), minibatch_size=8)
    sizes = [
        int(f.shape[0])
        for f, _ in service.dataset(pb.Shard(name=a, start=0, end=30), Mode.TRAINING)
    ]
    assert sizes == [8, 8, 8, 6]


def test_tasks_larger_than_a_chunk_and_filtered_out_tasks(tmp_path):
    import tensorflow as tf
    from elasticdl.worker import task_data_service as tds

    a = _write(tmp_path / "a.rio", range(100))
    service = TaskDataService(_spec(), minibatch_size=3)
    assert service.chunk_records == 3 * tds.CHUNK_MINIBATCHES
    big = pb.Shard(name=a, start=0, end=100)  # 100 > 96 records: two chunks
    sizes = [int(f.shape[0]) for f, _ in service.dataset(big, Mode.TRAINING)]
    assert sum(sizes) == 100 and sizes[:-1] == [3] * (len(sizes) - 1)
    assert _labels(service, big, Mode.TRAINING) == [10 * i for i in range(100)]

    def drop_all(dataset, mode, metadata):
        return _feed(dataset, mode, metadata).filter(lambda x, y: x < 0)

    spec = _spec()
    spec.feed = drop_all
    empty = TaskDataService(spec, minibatch_size=8)
    assert list(empty.dataset(pb.Shard(name=a, start=0, end=10), Mode.TRAINING)) == []
    assert tf.executing_eagerly()


def test_training_pipelines_get_their_own_thread_pool(tmp_path):
    a = _write(tmp_path / "a.rio", range(40))
    service = TaskDataService(_spec(), minibatch_size=8, training_threads=1)
    assert _labels(service, pb.Shard(name=a, start=0, end=40), Mode.TRAINING) == [
        10 * i for i in range(40)
    ]
    assert _labels(service, pb.Shard(name=a, start=0, end=8), Mode.EVALUATION) == [
        10 * i for i in range(8)
    ]
    training = next(p for k, p in service._pipelines.items() if k[0] == Mode.TRAINING)
    evaluation = next(p for k, p in service._pipelines.items() if k[0] == Mode.EVALUATION)
    assert training.per_record.options().threading.private_threadpool_size == 1
    assert evaluation.per_record.options().threading.private_threadpool_size is None
    assert TaskDataService(_spec(), minibatch_size=8).training_threads >= 1


def test_pieces_of_a_task_larger_than_a_chunk_give_its_records_in_order(tmp_path):
    a = _write(tmp_path / "a.rio", range(200))
    service = TaskDataService(_spec(), minibatch_size=3)  # chunks of 96 records
    big = pb.Shard(name=a, start=10, end=200)
    pieces = service.pieces(big)
    assert [(p.start, p.end) for p in pieces] == [(10, 106), (106, 200)]
    labels = [x for p in pieces for x in _labels(service, p, Mode.TRAINING)]
    assert labels == _labels(service, big, Mode.TRAINING) == [10 * i for i in range(10, 200)]
    small = pb.Shard(name=a, start=0, end=96)
    assert service.pieces(small) == [small]

    shuffled = list(np.random.default_rng(0).permutation(np.arange(20, 220)) % 200)
    mixed = pb.Shard(name=a, start=0, end=200, indices=shuffled)
    parts = service.pieces(mixed)
    assert [len(p.indices) for p in parts] == [96, 96, 8]
    assert all(p.start == min(p.indices) and p.end == max(p.indices) + 1 for p in parts)
    labels = [x for p in parts for x in _labels(service, p, Mode.TRAINING)]
    assert labels == [10 * i for i in shuffled]


# ------------------------------------------------------------------ feeds run on whole chunks
def _example_records(path, n):
    import tensorflow as tf

    with recordio.Writer(str(path)) as w:
        for i in range(n):
            feature = {
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i, -0.5 * i])),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
            }
            w.write(
                tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
            )
    return str(path)


def _example_spec(extra=None):
    import tensorflow as tf

    columns = {
        "x": tf.io.FixedLenFeature([2], tf.float32),
        "y": tf.io.FixedLenFeature([1], tf.int64),
    }

    def feed(dataset, mode, metadata):
        ds = dataset.map(
            lambda r: tf.io.parse_single_example(r, columns), num_parallel_calls=tf.data.AUTOTUNE
        )
        ds = ds.map(lambda ex: ({"x": ex["x"] * 2.0}, ex["y"] * 10))
        return extra(ds) if extra else ds

    spec = _spec()
    spec.feed = feed
    return spec


def _xs_and_labels(service, shard, mode):
    xs, labels = [], []
    for features, label in service.dataset(shard, mode):
        xs.extend(features["x"].numpy().tolist())
        labels.extend(label.numpy().ravel().tolist())
    return xs, labels


def test_a_feed_of_maps_runs_on_whole_chunks_once_checked_against_per_record(tmp_path, caplog):
    import logging

    a = _example_records(tmp_path / "a.rio", 300)
    service = TaskDataService(_example_spec(), minibatch_size=8)
    with caplog.at_level(logging.INFO, logger="elasticdl.worker.task_data_service"):
        first = _xs_and_labels(service, pb.Shard(name=a, start=0, end=20), Mode.TRAINING)
    assert first == ([[2.0 * i, -1.0 * i] for i in range(20)], [10 * i for i in range(20)])
    assert service._batched_feed == {service._pipeline_key(a, Mode.TRAINING): True}
    assert "runs on whole chunks of records" in caplog.text
    # From now on the per-record pipeline is never run: every task's values come from the
    # batched one, in the right order, for small tasks, shuffled indices and streamed ones.
    for pipeline in service._pipelines.values():
        pipeline.per_record = None
    shuffled = [17, 3, 250, 3, 99]
    assert _xs_and_labels(
        service, pb.Shard(name=a, start=3, end=251, indices=shuffled), Mode.TRAINING
    )[1] == [10 * i for i in shuffled]
    assert _xs_and_labels(service, pb.Shard(name=a, start=40, end=300), Mode.TRAINING)[1] == [
        10 * i for i in range(40, 300)
    ]  # 260 records: more than one chunk of 256, streamed
    sizes = [
        int(y.shape[0])
        for _, y in service.dataset(pb.Shard(name=a, start=0, end=30), Mode.TRAINING)
    ]
    assert sizes == [8, 8, 8, 6]


def test_a_feed_that_shuffles_runs_batched_and_shuffles_each_task(tmp_path):
    a = _example_records(tmp_path / "a.rio", 400)
    service = TaskDataService(_example_spec(lambda ds: ds.shuffle(64)), minibatch_size=8)
    orders = []
    for start, end in ((0, 200), (0, 200), (0, 200), (100, 400)):
        labels = _xs_and_labels(service, pb.Shard(name=a, start=start, end=end), Mode.TRAINING)[1]
        assert sorted(labels) == [10 * i for i in range(start, end)]  # each record once
        orders.append(labels)
        assert service._batched_feed == {service._pipeline_key(a, Mode.TRAINING): True}
        for pipeline in service._pipelines.values():  # the batched pipeline from now on
            pipeline.per_record = None
    # reshuffled every task (the first ran record by record, the next ones batched)
    assert orders[1] != orders[2] and orders[1] != sorted(orders[1])
    # a 64-record buffer brings no record more than 63 places forward, as record by record
    assert all(labels.index(10 * i) >= i - 63 for labels in orders[:3] for i in range(200))


def test_feeds_that_cannot_run_batched_stay_per_record_and_say_why(tmp_path, caplog):
    import logging

    import tensorflow as tf

    a = _example_records(tmp_path / "a.rio", 40)
    cases = {
        # random numbers: pfor vectorizes them, but not to the per-record values
        "values differ": lambda ds: ds.map(
            lambda f, y: ({"x": f["x"] + tf.random.uniform([2])}, y)
        ),
        "not only map": lambda ds: ds.filter(lambda f, y: y[0] % 20 == 0),
        # an op pfor has no rule for; its error log is not the user's to read
        "EagerPyFunc": lambda ds: ds.map(
            lambda f, y: (f, tf.py_function(lambda v: v + 0, [y], tf.int64))
        ),
    }
    for why, extra in cases.items():
        service = TaskDataService(_example_spec(extra), minibatch_size=8)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            for start in (0, 10, 20):
                labels = _xs_and_labels(
                    service, pb.Shard(name=a, start=start, end=start + 10), Mode.TRAINING
                )[1]
                want = [10 * i for i in range(start, start + 10)]
                assert labels == (
                    [y for y in want if y % 20 == 0] if why == "not only map" else want
                )
        key = service._pipeline_key(a, Mode.TRAINING)
        assert service._batched_feed == {key: False}, why
        lines = [r.getMessage() for r in caplog.records if "record by record" in r.getMessage()]
        assert len(lines) == 1 and why in lines[0], (why, lines)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], why
