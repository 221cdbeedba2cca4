"""The sparse benchmark's model reads its records batched: its feed (a parse map) runs on whole
chunks of records in the worker, with the values the per-record feed gives, in every mode."""
import numpy as np
from elasticdl.common.model_utils import Mode, load_model_spec
from elasticdl.data.datasets import prepare
from elasticdl.data.reader import create_data_reader
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.worker.task_data_service import TaskDataService

MODEL_ZOO = __file__.rsplit("/deepfm/", 1)[0]


def test_deepfm_ctr_feed_runs_batched_with_the_per_record_values(tmp_path):
    prepared = prepare(
        "synthetic_ctr",
        str(tmp_path / "ctr"),
        progress=False,
        params=dict(rows=600, features=4, vocab=50, zipf=1.1, seed=3),
    )
    spec = load_model_spec(
        MODEL_ZOO, "deepfm.deepfm_ctr.custom_model", model_params="features=4; vocab=50"
    )
    train = prepared.files["train"][0]
    shard = next(iter(create_data_reader(train, records_per_task=None).create_shards()))
    first = pb.Shard(name=shard.name, start=0, end=64)
    second = pb.Shard(name=shard.name, start=64, end=64 + 70)
    for mode in (Mode.TRAINING, Mode.EVALUATION, Mode.PREDICTION):
        batched = TaskDataService(spec, minibatch_size=16)
        per_record = TaskDataService(spec, minibatch_size=16)
        per_record._batched_feed[per_record._pipeline_key(shard.name, mode)] = False
        for s in (first, second):
            got = list(batched.dataset(s, mode))
            want = list(per_record.dataset(s, mode))
            assert len(got) == len(want) == -(-(s.end - s.start) // 16)
            for g, w in zip(got, want):
                flat_g, flat_w = _flat(g), _flat(w)
                assert [x.shape for x in flat_g] == [x.shape for x in flat_w]
                assert all(np.array_equal(x, y) for x, y in zip(flat_g, flat_w))
        assert batched._batched_feed == {batched._pipeline_key(shard.name, mode): True}, mode


def _flat(value):
    import tensorflow as tf

    return [np.asarray(t) for t in tf.nest.flatten(value)]
