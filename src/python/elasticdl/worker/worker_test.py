"""Worker loop against the real master servicer and PS (in-process, real gRPC)."""
import os
import textwrap

import numpy as np
from elasticdl.data.example_codec import encode_example
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.worker.fake_master_and_data import ScriptedMaster, ZeroMinibatches
from elasticdl.worker.main import main
from elasticdl_testing.local_job import run_local_job, write_recordio

_MODEL = """
import keras
import tensorflow as tf
from elasticdl.worker.callbacks import LearningRateScheduler, MaxStepsStopping

SEEN_LR = []

def custom_model():
    inp = keras.Input(shape=(2,), name="x")
    return keras.Model(inp, keras.layers.Dense(1, name="out")(inp))

def loss(labels, predictions):
    return tf.reduce_mean(tf.square(tf.cast(labels, tf.float32) - tf.reshape(predictions, [-1])))

def optimizer(lr=0.05):
    return keras.optimizers.SGD(lr)

def _parse(r):
    ex = tf.io.parse_single_example(r, {"x": tf.io.FixedLenFeature([2], tf.float32),
                                       "y": tf.io.FixedLenFeature([], tf.float32)})
    return ex["x"], ex["y"]

def feed(dataset, mode, metadata):
    return dataset.map(_parse)

def eval_metrics_fn():
    return {"mse": lambda labels, predictions: (labels - predictions.reshape(-1)) ** 2}

def _schedule(version):
    SEEN_LR.append(version)
    return 0.05 if version < 3 else 0.01

def callbacks():
    return [LearningRateScheduler(_schedule), MaxStepsStopping(5)]
"""


def _data(path, n):
    rng = np.random.default_rng(0)
    recs = []
    for _ in range(n):
        x = rng.normal(size=2).astype(np.float32)
        recs.append(encode_example({"x": x.tolist(), "y": [float(2 * x[0] - x[1])]}))
    return write_recordio(path, recs)


def _zoo(tmp_path, package: str, model: str):
    """A model zoo holding ``package.model`` with the text ``model``."""
    zoo = tmp_path / "zoo"
    (zoo / package).mkdir(parents=True)
    (zoo / package / "__init__.py").write_text("")
    (zoo / package / "model.py").write_text(textwrap.dedent(model))
    return zoo


def _run_unstopped_job(tmp_path, testing):
    """96 records in tasks of 8 through one PS, with a model no callback stops early;
    ``testing`` is the harness module (tests patch its names)."""
    no_stop = _MODEL.replace("MaxStepsStopping(5)", "MaxStepsStopping(10**6)")
    zoo = _zoo(tmp_path, "lin", no_stop)
    train = _data(str(tmp_path / "train.rio"), 96)
    return testing.run_local_job(
        str(zoo), "lin.model.custom_model", training_data=train, minibatch_size=8, num_ps=1
    )


def test_worker_loop_callbacks_max_steps_and_export(tmp_path):
    zoo = _zoo(tmp_path, "lin", _MODEL)
    train = _data(str(tmp_path / "train.rio"), 160)
    test = _data(str(tmp_path / "test.rio"), 32)
    result = run_local_job(
        str(zoo),
        "lin.model.custom_model",
        training_data=train,
        validation_data=test,
        saved_model_path=str(tmp_path / "sm"),
        minibatch_size=8,
        num_minibatches_per_task=2,
        num_ps=1,
    )
    assert result.exit_code == 0
    # MaxStepsStopping(5): training stops at version 5; later tasks are acknowledged untrained.
    assert result.ps_versions == [5]
    assert result.worker.trainer.steps == 5
    assert result.task_summary.finished
    # The schedule was consulted with the PS version before each step, and its lr is in use.
    import lin.model as m

    assert m.SEEN_LR[:5] == [0, 1, 2, 3, 4]
    assert result.worker.trainer.learning_rate == np.float32(0.01)
    assert "mse" in result.evaluation.metrics
    assert (tmp_path / "sm" / "saved_model.pb").exists()


def test_main_rejects_bad_flags_with_exit_2(tmp_path, capsys):
    from elasticdl.common import replica_spec
    from elasticdl.common.job_spec import JobSpec

    job, _ = JobSpec(
        job_name="j", model_zoo=str(tmp_path), model_def="a.b.custom_model", training_data="/d"
    ).resolve(check_local_paths=False)
    spec = replica_spec.derive(
        replica_spec.WorkerSpec, job, worker_id=0, master_addr="127.0.0.1:1", ps_addrs=("p:1",)
    )
    argv = replica_spec.to_argv(spec)
    assert main(argv + ["--ps_addrs="]) == 2
    assert "--ps_addrs is empty" in capsys.readouterr().err
    assert main(argv + ["--minibatch_size=-1"]) == 2
    assert "--minibatch_size must be > 0" in capsys.readouterr().err


def test_main_needs_the_job_secret(tmp_path, capsys, monkeypatch):
    from elasticdl.common import replica_spec
    from elasticdl.common.auth import JOB_SECRET_ENV
    from elasticdl.common.job_spec import JobSpec

    job, _ = JobSpec(
        job_name="j", model_zoo=str(tmp_path), model_def="a.b.custom_model", training_data="/d"
    ).resolve(check_local_paths=False)
    spec = replica_spec.derive(
        replica_spec.WorkerSpec, job, worker_id=0, master_addr="127.0.0.1:1", ps_addrs=("p:1",)
    )
    monkeypatch.delenv(JOB_SECRET_ENV, raising=False)
    assert main(replica_spec.to_argv(spec)) == 2
    err = capsys.readouterr().err
    assert "$ELASTICDL_JOB_SECRET is not set" in err and err.count("\n") == 1


def test_reports_run_on_the_look_ahead_thread_in_order_and_count_once(tmp_path, monkeypatch):
    """With a look-ahead in flight a task's result is reported on the look-ahead thread while
    the next task trains, in the same call that asks for the task after it; the master must
    still see every report before the next task is handed out, count every task once, and the
    loop must never stall on a WAIT."""
    import threading

    from elasticdl.worker.master_client import MasterClient
    from elasticdl.worker.worker import Worker
    from elasticdl_testing import local_job as testing

    calls = []
    rpcs = []
    nice = {}  # thread name -> its nice value when it called the master

    def note_nice():
        name = threading.current_thread().name
        nice[name] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    class Recording(MasterClient):
        def get_task(self, *a, **k):
            note_nice()
            rpcs.append("get_task")
            task = super().get_task(*a, **k)
            calls.append(("get", threading.current_thread().name, task.task_id, task.type))
            return task

        def report_task_result(self, task_id, *a, **k):
            rpcs.append("report_task_result")
            calls.append(("report", threading.current_thread().name, task_id, None))
            return super().report_task_result(task_id, *a, **k)

        def report_and_get_task(self, task_id, *a, **k):
            note_nice()
            rpcs.append("report_and_get_task")
            calls.append(("report", threading.current_thread().name, task_id, None))
            task = super().report_and_get_task(task_id, *a, **k)
            calls.append(("get", threading.current_thread().name, task.task_id, task.type))
            return task

    waits = []
    original_next = Worker._next_task

    def next_task(self):
        task, batches = original_next(self)
        if task.type == pb.WAIT:
            waits.append(task)
        return task, batches

    monkeypatch.setattr(testing, "MasterClient", Recording)
    monkeypatch.setattr(Worker, "_next_task", next_task)
    result = _run_unstopped_job(tmp_path, testing)
    assert result.exit_code == 0
    summary = result.task_summary
    assert summary.finished and summary.records_trained == 96 and summary.tasks_done == 6
    reports = [c for c in calls if c[0] == "report"]
    assert sorted(c[2] for c in reports) == sorted({c[2] for c in reports})  # each task once
    assert any(c[1].startswith("task-ahead") for c in reports)  # the asynchronous path ran
    # Every task handed out was reported before the worker was told there is no more work.
    handed = {c[2] for c in calls if c[0] == "get" and c[3] == pb.TRAINING}
    last_get = max(i for i, c in enumerate(calls) if c[0] == "get")
    assert calls[last_get][3] == pb.NONE
    assert handed == {c[2] for c in calls[:last_get] if c[0] == "report"}
    assert waits == []  # the loop never slept on a WAIT
    # One round trip per task: results ride with the look-ahead's request (the first task,
    # the first look-ahead, the last result and the final NONE are the only extra calls).
    assert rpcs.count("report_and_get_task") >= summary.tasks_done - 2
    assert len(rpcs) <= summary.tasks_done + 3, rpcs
    # The look-ahead runs at a lower CPU priority than the thread that trains.
    main_nice = os.getpriority(os.PRIO_PROCESS, 0)
    ahead = {v for k, v in nice.items() if k.startswith("task-ahead")}
    assert ahead == {min(19, main_nice + 10)}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_nice


def test_a_result_no_look_ahead_picks_up_is_sent_before_the_next_task_runs():
    """A training result waits for the next look-ahead to carry it; when the next task starts
    none (here an evaluation task), the result must go out at once, not after that task."""
    import threading
    import time
    from types import SimpleNamespace

    from elasticdl.worker import trainer
    from elasticdl.worker.worker import JobType, Worker, WorkerConfig

    reported = []
    arrived = threading.Event()

    def task(task_id, kind):
        return pb.Task(task_id=task_id, type=kind, shard=pb.Shard(name="f", start=0, end=4))

    def on_report(task_id, err_message):
        reported.append(task_id)
        if task_id == 1:
            arrived.set()

    class Trainer(trainer.Trainer):
        model_version = 0

        def ensure_model(self, features, model=None):
            pass

        def train_minibatch(self, features, labels, send_state=False):
            time.sleep(0.05)  # the look-ahead fetches the evaluation task meanwhile
            return 0.0

        def forward(self, features):
            raise AssertionError("the test's evaluate_task replaces the worker's")

        pull_model = export_saved_model = forward

    evaluated = []

    def evaluate_task(self, t):
        # The first task's result reaches the master while this task runs, not after it.
        evaluated.append(arrived.wait(10))
        return {"records": 4}

    spec = SimpleNamespace(callbacks=None)
    worker = Worker(
        WorkerConfig(worker_id=0, job_type=JobType.TRAINING_WITH_EVALUATION, minibatch_size=4),
        spec,
        ScriptedMaster(
            [task(1, pb.TRAINING), task(2, pb.EVALUATION), pb.Task(type=pb.NONE)], on_report
        ),
        Trainer(),
        ZeroMinibatches(1),
    )
    worker.evaluate_task = evaluate_task.__get__(worker)
    assert worker.run() == 0
    assert evaluated == [True]
    assert reported == [1, 2]


def test_a_training_task_is_reported_only_once_the_ps_acknowledged_its_pushes():
    """A trainer that pushes in the background (async PS): the task's result goes to the
    master after every push of it was answered; a push that failed fails its task (the
    master runs it again) and not the next one."""
    from types import SimpleNamespace

    from elasticdl.worker import trainer
    from elasticdl.worker.worker import JobType, Worker, WorkerConfig

    events = []

    def task(task_id):
        return pb.Task(task_id=task_id, type=pb.TRAINING, shard=pb.Shard(name="f", start=0, end=8))

    class BackgroundPushes(trainer.Trainer):
        model_version = 0
        in_flight = 0
        failing = {1}  # the first task's pushes fail

        def ensure_model(self, features, model=None):
            pass

        def train_minibatch(self, features, labels, send_state=False):
            self.in_flight += 1
            return 0.0

        def wait_for_pushes(self):
            pushes, self.in_flight = self.in_flight, 0
            if pushes:
                events.append(("acknowledged", pushes))
                if self.failing:
                    self.failing.pop()
                    raise RuntimeError("push failed")

        def forward(self, features):
            raise AssertionError("no evaluation here")

        pull_model = export_saved_model = forward

    worker = Worker(
        WorkerConfig(worker_id=0, job_type=JobType.TRAINING_ONLY, prefetch_next_task=False),
        SimpleNamespace(callbacks=None),
        ScriptedMaster(
            [task(1), task(2), pb.Task(type=pb.NONE)],
            lambda task_id, err_message: events.append(("report", task_id, err_message)),
        ),
        BackgroundPushes(),
        ZeroMinibatches(2),
    )
    assert worker.run() == 0
    assert events == [
        ("acknowledged", 2),
        ("report", 1, "RuntimeError: push failed"),
        ("acknowledged", 2),
        ("report", 2, ""),
    ]


_EXPORTER_MODEL = _MODEL.replace(
    "from elasticdl.worker.callbacks import LearningRateScheduler, MaxStepsStopping",
    "from elasticdl.worker.callbacks import LearningRateScheduler, MaxStepsStopping, "
    "SavedModelExporter",
).replace(
    "    return [LearningRateScheduler(_schedule), MaxStepsStopping(5)]",
    """    return [LearningRateScheduler(_schedule), CountingExporter(None, None, None)]

EXPORTS = []

class CountingExporter(SavedModelExporter):
    def on_train_end(self, logs=None):
        EXPORTS.append(self)
        super().on_train_end(logs)""",
)


def test_the_model_files_saved_model_exporter_is_the_only_export(tmp_path, monkeypatch):
    # The model file lists a SavedModelExporter (with the original's three constructor
    # arguments): the worker runs that one and adds none of its own, so the model is exported
    # once, by it, to --output.
    zoo = _zoo(tmp_path, "linexp", _EXPORTER_MODEL)
    from elasticdl.worker import ps_trainer

    exported = []
    real_export = ps_trainer.PSTrainer.export_saved_model

    def export(self, path):
        exported.append(path)
        real_export(self, path)

    monkeypatch.setattr(ps_trainer.PSTrainer, "export_saved_model", export)
    result = run_local_job(
        str(zoo),
        "linexp.model.custom_model",
        training_data=_data(str(tmp_path / "train.rio"), 64),
        saved_model_path=str(tmp_path / "sm"),
        minibatch_size=8,
        num_minibatches_per_task=2,
        num_ps=1,
    )
    assert result.exit_code == 0
    import linexp.model as m

    assert len(m.EXPORTS) == 1 and exported == [str(tmp_path / "sm")]
    assert (tmp_path / "sm" / "saved_model.pb").exists()


def test_a_timed_out_task_handed_back_while_it_runs_trains_once(tmp_path, monkeypatch):
    """The master takes back every task a worker holds (they ran past the task timeout, as
    when its PS was stopped) while the worker runs one of them; the look-ahead then gets that
    same task again (or its lease does, with tasks still queued in the worker). It must not
    train any a second time: every task reported once, no stale report, every record counted
    once."""
    import threading

    from elasticdl.worker.master_client import MasterClient
    from elasticdl_testing import local_job as testing

    managers = []

    class Captured(testing.TaskManager):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            managers.append(self)

    reports = []
    timed_out = []

    class TimingOut(MasterClient):
        def report_and_get_task(self, task_id, *a, **k):
            reports.append(task_id)
            if not timed_out and threading.current_thread().name.startswith("task-ahead"):
                tm = managers[0]
                floor, factor = tm.config.timeout_floor_s, tm.config.timeout_factor
                tm.config.timeout_floor_s = tm.config.timeout_factor = 0.0
                timed_out.append(tm.check_timeouts())
                tm.config.timeout_floor_s, tm.config.timeout_factor = floor, factor
            return super().report_and_get_task(task_id, *a, **k)

        def report_task_result(self, task_id, *a, **k):
            reports.append(task_id)
            return super().report_task_result(task_id, *a, **k)

    monkeypatch.setattr(testing, "TaskManager", Captured)
    monkeypatch.setattr(testing, "MasterClient", TimingOut)
    result = _run_unstopped_job(tmp_path, testing)
    assert result.exit_code == 0
    # Every task the worker held was taken back: its lease (the one it ran among them).
    assert timed_out and len(next(iter(timed_out[0].values()))) >= 2, timed_out
    summary = result.task_summary
    assert summary.tasks_recovered == len(next(iter(timed_out[0].values())))
    assert summary.stale_reports == 0, reports
    assert sorted(reports) == sorted(set(reports)), reports  # each task reported once
    assert summary.finished and summary.records_trained == 96 and summary.tasks_done == 6


def test_a_task_of_a_new_ps_set_moves_the_trainer_before_it_runs():
    """The master stamps the tasks it hands out after the job's PS count changed: the worker
    hands each one to its PS set (worker.ps_set) before running it, so it trains through the
    new PS from that task on."""
    from types import SimpleNamespace

    from elasticdl.worker.worker import JobType, Worker, WorkerConfig

    script = [
        pb.Task(task_id=1, type=pb.EVALUATION, ps_generation=1, ps_addrs=["ps-0:1", "ps-1:1"]),
        pb.Task(type=pb.NONE),
    ]
    events = []

    class Master:
        def get_task(self, task_type=pb.NONE):
            return script.pop(0)

        def report_and_get_task(self, task_id, err_message="", exec_counters=None):
            events.append(("report", task_id, err_message))
            return self.get_task()

    class PSSet:
        def follow(self, task):
            events.append(("follow", task.task_id, list(task.ps_addrs)))

    worker = Worker(
        WorkerConfig(worker_id=0, job_type=JobType.TRAINING_WITH_EVALUATION, minibatch_size=4),
        SimpleNamespace(callbacks=None),
        Master(),
        SimpleNamespace(leave=lambda: None),
        SimpleNamespace(),
        ps_set=PSSet(),
    )
    worker.evaluate_task = lambda task: events.append(("run", task.task_id)) or {"records": 4}
    assert worker.run() == 0
    assert events == [("follow", 1, ["ps-0:1", "ps-1:1"]), ("run", 1), ("report", 1, "")]


def test_a_task_larger_than_a_pipeline_call_trains_piece_by_piece_computed_ahead(
    tmp_path, monkeypatch
):
    """A task of several pipeline calls trains each piece's minibatches while the next piece
    is computed on the look-ahead thread; every record is still trained once, in order."""
    import threading

    from elasticdl.worker import task_data_service
    from elasticdl.worker.worker import Worker

    monkeypatch.setattr(task_data_service, "CHUNK_MINIBATCHES", 2)  # pieces of 16 records
    computed = []  # (thread, piece start, piece end)
    trained = []  # thread of each step
    original_piece = Worker._piece_minibatches

    def piece_minibatches(self, piece):
        computed.append((threading.current_thread().name, piece.start, piece.end))
        return original_piece(self, piece)

    original_train = Worker._train_minibatches

    def train_minibatches(self, minibatches):
        def noting():
            for item in minibatches:
                trained.append(threading.current_thread().name)
                yield item

        return original_train(self, noting())

    monkeypatch.setattr(Worker, "_piece_minibatches", piece_minibatches)
    monkeypatch.setattr(Worker, "_train_minibatches", train_minibatches)
    no_stop = _MODEL.replace("MaxStepsStopping(5)", "MaxStepsStopping(10**6)")
    zoo = _zoo(tmp_path, "lin", no_stop)
    train = _data(str(tmp_path / "train.rio"), 96)
    result = run_local_job(
        str(zoo),
        "lin.model.custom_model",
        training_data=train,
        minibatch_size=8,
        num_minibatches_per_task=6,  # tasks of 48 records: three pieces of 16
        num_ps=1,
    )
    assert result.exit_code == 0
    summary = result.task_summary
    assert summary.finished and summary.records_trained == 96 and summary.tasks_done == 2
    assert result.worker.trainer.steps == 12
    pieces = sorted((start, end) for _, start, end in computed)
    assert pieces == [(s, s + 16) for s in range(0, 96, 16)]  # each piece once
    # Only the first task's first piece was computed by the thread that trains: the rest ahead.
    on_main = [c for c in computed if not c[0].startswith("task-ahead")]
    assert [(s, e) for _, s, e in on_main] == [(0, 16)], computed
    assert len(set(trained)) == 1 and not trained[0].startswith("task-ahead")
