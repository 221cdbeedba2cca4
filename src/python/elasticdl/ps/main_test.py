"""`python -m elasticdl.ps.main` as a real process: serving, checkpointing, restart recovery."""
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
from elasticdl.common import auth
from elasticdl.common import tensor_utils as tu
from elasticdl.common.replica_spec import ps_spec_from_argv
from elasticdl.common.spec_codec import SpecError
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc
from elasticdl.ps import checkpoint

SECRET = "a-job-secret"


def _channel(port: int, secret: str | None = SECRET):
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    return channel if secret is None else auth.authenticated_channel(channel, secret)


class PSProcess:
    def __init__(self, *args, secret: str | None = SECRET):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        env.pop(auth.JOB_SECRET_ENV, None)
        if secret is not None:
            env[auth.JOB_SECRET_ENV] = secret
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "elasticdl.ps.main",
                "--bind_host",
                "127.0.0.1",
                "--port",
                "0",
                *args,
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.lines: queue.Queue = queue.Queue()
        self.log = []
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    def _pump(self):
        for line in self.proc.stderr:
            self.lines.put(line)

    def wait_for(self, pattern, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if not self._pump_thread.is_alive() and self.lines.empty():
                    break  # the process closed stderr: nothing more will come
                continue
            self.log.append(line)
            m = re.search(pattern, line)
            if m:
                return m
        raise AssertionError(f"{pattern!r} not logged; log so far:\n{''.join(self.log)}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def test_serves_checkpoints_and_recovers_after_restart(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    args = [
        "--ps_id",
        "0",
        "--num_ps_pods",
        "1",
        "--use_async",
        "--checkpoint_dir",
        ckpt,
        "--checkpoint_steps",
        "2",
        "--opt_type",
        "sgd",
        "--opt_args",
        "learning_rate=0.5;",
        "--master_addr",
        "127.0.0.1:1",
    ]
    ps = PSProcess(*args)
    try:
        port = int(ps.wait_for(r"PS 0 of 1 listening on 127\.0\.0\.1:(\d+)").group(1))
        with _channel(port) as channel:
            stub = pb_grpc.PserverStub(channel)
            model = pb.Model()
            tu.ndarray_to_pb(np.ones(3, np.float32), model.dense_parameters["w"])
            model.embedding_table_infos.add(name="e", dim=2, initializer="ones")
            stub.push_model(model)
            for v in range(2):
                req = pb.PushGradientsRequest()
                req.gradients.version = v
                tu.ndarray_to_pb(np.ones(3, np.float32), req.gradients.dense_parameters["w"])
                tu.indexed_rows_to_pb(
                    tu.IndexedRows(np.ones((1, 2), np.float32), np.array([4])),
                    req.gradients.embedding_tables["e"],
                )
                assert stub.push_gradients(req).accepted
        ps.wait_for(r"saved checkpoint version 2")
    finally:
        assert ps.stop() == 0
    assert checkpoint.get_latest_valid_version_dir(ckpt).endswith("version-2")

    ps = PSProcess(*args)
    try:
        ps.wait_for(r"restored version 2 from .*version-2")
        port = int(ps.wait_for(r"listening on 127\.0\.0\.1:(\d+)").group(1))
        with _channel(port) as channel:
            stub = pb_grpc.PserverStub(channel)
            resp = stub.pull_dense_parameters(pb.PullDenseParametersRequest(version=0))
            assert resp.initialized and resp.version == 2
            np.testing.assert_allclose(tu.pb_to_ndarray(resp.dense_parameters["w"]), [0, 0, 0])
            rows = stub.pull_embedding_vectors(
                pb.PullEmbeddingVectorsRequest(name="e", ids=tu.ndarray_to_pb(np.array([4, 5])))
            )
            np.testing.assert_allclose(tu.pb_to_ndarray(rows), [[0, 0], [1, 1]])
    finally:
        assert ps.stop() == 0


def test_bad_flags_exit_2_with_a_clear_message(tmp_path):
    ps = PSProcess("--opt_type", "RMSprop")
    ps.wait_for(r"error: --opt_type 'RMSprop' is not supported")
    assert ps.proc.wait(30) == 2
    ps = PSProcess("--checkpoint_dir_for_init", str(tmp_path / "nothing"))
    ps.wait_for(r"error: no valid checkpoint")
    assert ps.proc.wait(30) == 2


@pytest.mark.parametrize(
    "argv,expected",
    [
        ([], False),
        (["--use_async"], True),
        (["--use_async=true"], True),
        (["--use_async=no"], False),
        (["--use_async", "1"], True),
        (["--use_async=False"], False),
    ],
)
def test_bool_flags(argv, expected):
    assert ps_spec_from_argv(argv).use_async is expected


def test_bad_flags_are_one_line_errors():
    with pytest.raises(SpecError, match="--lr_staleness_modulation: expected true or false"):
        ps_spec_from_argv(["--lr_staleness_modulation=maybe"])
    with pytest.raises(SpecError, match="unrecognized arguments: --namespace=x"):
        ps_spec_from_argv(["--namespace=x"])  # unknown flags are errors, not ignored


def test_only_callers_with_the_job_secret_are_served():
    ps = PSProcess("--use_async")
    try:
        port = int(ps.wait_for(r"listening on 127\.0\.0\.1:(\d+)").group(1))
        model = pb.Model()
        tu.ndarray_to_pb(np.ones(3, np.float32), model.dense_parameters["w"])
        for secret in (None, "another-jobs-secret"):
            with _channel(port, secret) as channel:
                with pytest.raises(grpc.RpcError) as err:
                    pb_grpc.PserverStub(channel).push_model(model)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with _channel(port) as channel:
            stub = pb_grpc.PserverStub(channel)
            # The rejected pushes changed nothing: the PS has no model yet.
            assert not stub.pull_dense_parameters(pb.PullDenseParametersRequest()).initialized
            stub.push_model(model)
            assert stub.pull_dense_parameters(pb.PullDenseParametersRequest()).initialized
    finally:
        assert ps.stop() == 0


def test_a_ps_without_its_job_secret_does_not_start():
    ps = PSProcess(secret=None)
    ps.wait_for(r"error: \$ELASTICDL_JOB_SECRET is not set")
    assert ps.proc.wait(30) == 2
