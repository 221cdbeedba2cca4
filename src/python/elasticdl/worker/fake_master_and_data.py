"""In-process stand-ins for the master and the task data a Worker runs against, for tests
that script the tasks and only count what the worker reports."""
from elasticdl.proto import elasticdl_pb2 as pb


class ScriptedMaster:
    """Hands out `script`'s tasks in order; each report goes to `on_report(task_id, err)`."""

    def __init__(self, script, on_report):
        self.script = list(script)
        self.on_report = on_report

    def get_task(self, task_type=pb.NONE):
        return self.script.pop(0)

    def report_task_result(self, task_id, err_message="", exec_counters=None, fatal=False):
        self.on_report(task_id, err_message)

    def report_and_get_task(self, task_id, err_message="", exec_counters=None):
        self.report_task_result(task_id, err_message, exec_counters)
        return self.get_task()


class ZeroMinibatches:
    """Every shard reads as `minibatches` all-zero minibatches of 4 records of 2 features."""

    chunk_records = 8

    def __init__(self, minibatches):
        self.minibatches = minibatches

    def dataset(self, shard, mode):
        import tensorflow as tf  # only the tests that run a worker pay for TensorFlow

        return iter([(tf.zeros([4, 2]), tf.zeros([4]))] * self.minibatches)
