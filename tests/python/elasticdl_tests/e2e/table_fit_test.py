"""A job whose embedding table cannot fit in its PS's memory fails before any training, with
the PS's one line naming the table and the fixes; the same model with a small vocabulary
trains. Real local jobs through the `elasticdl` CLI (client -> master -> 2 PS + 1 worker)."""
import re
import textwrap

import pytest
from elasticdl.data.example_codec import encode_example
from elasticdl_testing.local_job import write_recordio

MODEL = textwrap.dedent(
    """
    import keras
    import tensorflow as tf
    from elasticdl.worker.layers import Embedding

    VOCAB = {vocab}


    def custom_model():
        item = keras.Input(shape=(1,), dtype="int64", name="item")
        emb = Embedding(16, input_dim=VOCAB, name="item_embedding", combiner="sum")(item)
        return keras.Model({{"item": item}}, keras.layers.Dense(1)(emb))


    def loss(labels, predictions):
        return tf.reduce_mean(tf.square(tf.reshape(labels, [-1]) - tf.reshape(predictions, [-1])))


    def optimizer(lr=0.01):
        return keras.optimizers.Adam(lr)


    def eval_metrics_fn():
        return {{}}


    def feed(dataset, mode, metadata):
        spec = {{
            "item": tf.io.FixedLenFeature([1], tf.int64),
            "label": tf.io.FixedLenFeature([1], tf.float32),
        }}

        def parse(record):
            ex = tf.io.parse_single_example(record, spec)
            return {{"item": ex["item"]}}, ex["label"]

        return dataset.map(parse)
    """
)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    (root / "tables").mkdir()
    (root / "tables" / "__init__.py").write_text("")
    (root / "tables" / "huge.py").write_text(MODEL.format(vocab=10**13))
    (root / "tables" / "small.py").write_text(MODEL.format(vocab=1000))
    records = [encode_example({"item": [i % 50], "label": [float(i % 2)]}) for i in range(128)]
    return root, write_recordio(str(root / "data" / "train.rio"), records)


def _train(cli, zoo, model: str, job: str):
    root, data = zoo
    return cli.run(
        "train",
        "--platform=local",
        f"--model_zoo={root}",
        f"--model_def=tables.{model}.custom_model",
        f"--training_data={data}",
        "--num_epochs=1",
        "--minibatch_size=16",
        "--num_minibatches_per_task=2",
        "--num_workers=1",
        "--num_ps_pods=2",
        f"--job_name={job}",
        timeout=300,
        check=False,
    )


def test_a_table_too_large_fails_the_job_before_training_and_a_small_one_trains(cli, zoo):
    proc = _train(cli, zoo, "huge", "huge-table")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    line = re.search(r"elasticdl: job huge-table Failed: (.*)", out)
    assert line, out[-3000:]
    assert line.group(1).startswith(
        "worker 0: PSRefusedModelError: embedding table 'item_embedding' (vocabulary "
        "10,000,000,000,000, dim 16: 5,000,000,000,000 rows x 222 B on each PS) needs "
    ), line.group(1)
    assert "GiB on each of 2 PS" in line.group(1) and "--num_ps_pods" in line.group(1)
    status = cli.status("huge-table")
    assert status["phase"] == "Failed"
    assert status["records_trained"] == 0 and status["model_version"] == 0

    proc = _train(cli, zoo, "small", "small-table")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    status = cli.status("small-table")
    assert status["phase"] == "Succeeded"
    assert status["records_trained"] == status["records_expected"] == 128
