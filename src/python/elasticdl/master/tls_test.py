"""Mutual TLS with certificates the test makes (Debian's `openssl`), on 127.0.0.1: a real job
(master, PS and worker processes) runs over it, and the job's servers refuse a client without
a certificate, with one of another CA, and a plaintext one. The job secret is still checked."""
import json
import shutil
import subprocess
from pathlib import Path

import grpc
import numpy as np
import pytest
from elasticdl.common import auth, tls
from elasticdl.common.job_spec import JobSpec
from elasticdl.common.spec_codec import SpecError
from elasticdl.data.example_codec import encode_example, float_feature, int64_feature
from elasticdl.data.recordio import Writer
from elasticdl.master.job import Job
from elasticdl.master.server import create_master_server
from elasticdl.master.servicer import MasterServicer
from elasticdl.master.task_manager import TaskManager, TaskManagerConfig
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc
from elasticdl.ps.server import PSConfig, PSServer

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")

ZOO = str(Path(__file__).parent / "testdata" / "zoo")


def _job_spec(tmp_path: Path, **tls_files) -> JobSpec:
    """One worker, one PS, one epoch of 192 records of a linearly separable problem."""
    data = tmp_path / "train"
    data.mkdir()
    rng = np.random.default_rng(0)
    with Writer(data / "part-0.rio") as w:
        for _ in range(192):
            x = rng.normal(size=4).astype(np.float32)
            w.write(encode_example({"x": float_feature(x), "label": int64_feature(int(x[0] > 0))}))
    spec, _ = JobSpec(
        job_name="tls",
        model_zoo=ZOO,
        model_def="tiny.linear.custom_model",
        training_data=str(data),
        minibatch_size=16,
        num_minibatches_per_task=2,
        num_workers=1,
        num_ps_pods=1,
        platform="local",
        job_dir=str(tmp_path / "job"),
        **tls_files,
    ).resolve()
    return spec


NEW_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")  # fast to make


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", *NEW_KEY, "-nodes", "-days", "2", "-subj",
             f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=d)  # fmt: skip


def _leaf(d: Path, name: str, ca: str) -> None:
    """A certificate for 127.0.0.1 and localhost, for both server and client use."""
    (d / f"{name}.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n" "extendedKeyUsage=serverAuth,clientAuth\n"
    )
    _openssl("req", *NEW_KEY, "-nodes", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)  # fmt: skip
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
             "-out", f"{name}.pem", cwd=d)  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    _ca(d, "ca")
    _leaf(d, "job", "ca")
    _ca(d, "rogue-ca")
    _leaf(d, "rogue", "rogue-ca")
    return d


def _files(d: Path, name: str = "job") -> dict:
    return dict(
        tls_cert_file=str(d / f"{name}.pem"),
        tls_key_file=str(d / f"{name}.key"),
        tls_ca_file=str(d / "ca.pem"),
    )


def _job_tls(d: Path) -> tls.TLS:
    f = _files(d)
    return tls.TLS.from_files(f["tls_cert_file"], f["tls_key_file"], f["tls_ca_file"])


def _refused(addr: str, creds, secret: str) -> grpc.RpcError:
    channel = grpc.insecure_channel(addr) if creds is None else grpc.secure_channel(addr, creds)
    with channel:
        stub = pb_grpc.MasterStub(auth.authenticated_channel(channel, secret))
        with pytest.raises(grpc.RpcError) as err:
            stub.get_task(pb.GetTaskRequest(worker_id=0), timeout=5)
    return err.value


def _intruders(d: Path):
    ca = (d / "ca.pem").read_bytes()
    rogue = ((d / "rogue.key").read_bytes(), (d / "rogue.pem").read_bytes())
    return {
        "plaintext": None,
        "no client certificate": grpc.ssl_channel_credentials(root_certificates=ca),
        "another CA's certificate": grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=rogue[0], certificate_chain=rogue[1]
        ),
    }


@pytest.mark.parametrize("use_asyncio", [True, False])
def test_the_master_serves_only_clients_with_the_jobs_certificate(certs, use_asyncio):
    tm = TaskManager(TaskManagerConfig(records_per_task=4), training_shards=[("t", 0, 8)])
    job_tls = _job_tls(certs)
    server, port = create_master_server(
        MasterServicer(tm), 0, "127.0.0.1", use_asyncio, secret="s3cret", tls_config=job_tls
    )
    addr = f"127.0.0.1:{port}"
    try:
        for who, creds in _intruders(certs).items():
            err = _refused(addr, creds, "s3cret")
            assert err.code() == grpc.StatusCode.UNAVAILABLE, who
        assert tm.summary().tasks_doing == 0
        # The certificate admits the connection; the secret is still required for a call.
        channel = tls.channel(addr, [], job_tls)
        err = _refused(addr, job_tls.channel_credentials(), "another-jobs-secret")
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        with channel:
            stub = pb_grpc.MasterStub(auth.authenticated_channel(channel, "s3cret"))
            assert stub.get_task(pb.GetTaskRequest(worker_id=0), timeout=10).task_id != 0
    finally:
        server.stop(0)


def test_a_ps_serves_only_clients_with_the_jobs_certificate(certs):
    ps = PSServer(PSConfig(port=0, bind_host="127.0.0.1", **_files(certs)), secret="s3cret")
    ps.start()
    addr = f"127.0.0.1:{ps.port}"
    try:
        for who, creds in _intruders(certs).items():
            channel = (
                grpc.insecure_channel(addr) if creds is None else grpc.secure_channel(addr, creds)
            )
            with channel:
                stub = pb_grpc.PserverStub(auth.authenticated_channel(channel, "s3cret"))
                with pytest.raises(grpc.RpcError) as err:
                    stub.pull_dense_parameters(pb.PullDenseParametersRequest(), timeout=5)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE, who
        with tls.channel(addr, [], _job_tls(certs)) as channel:
            stub = pb_grpc.PserverStub(auth.authenticated_channel(channel, "s3cret"))
            stub.pull_dense_parameters(pb.PullDenseParametersRequest(), timeout=10)
            # No stream channel: its frames would travel unencrypted beside the TLS calls.
            offer = stub.open_stream_channel(pb.OpenStreamChannelRequest(), timeout=10)
            assert offer.port == 0 and not offer.ticket and "TLS" in offer.reason
    finally:
        ps.stop(grace_s=0)


def test_a_job_trains_over_mutual_tls(certs, tmp_path):
    job = Job(_job_spec(tmp_path, **_files(certs)))
    # The master is up: a plaintext client with the job's own secret gets nowhere.
    secret = (tmp_path / "job" / "job_secret").read_text()
    assert _refused(f"127.0.0.1:{job.port}", None, secret).code() == grpc.StatusCode.UNAVAILABLE
    code = job.run()
    status = json.loads((tmp_path / "job" / "status.json").read_text())
    assert code == 0, status["message"]
    assert status["records_trained"] == status["records_expected"] == 192
    # The replicas were given the files (and no key material) in their specs.
    worker = job.launch_specs.worker(0)
    assert any("--tls_cert_file" in a for a in worker.args)
    assert not any("PRIVATE KEY" in a for a in worker.args)


def test_tls_flags_are_all_or_nothing_and_pem(certs, tmp_path):
    base = dict(job_name="j", model_def="tiny.linear.custom_model", training_data=str(tmp_path))
    files = _files(certs)
    for given, message in (
        ({"tls_cert_file": files["tls_cert_file"]}, "--tls_cert_file needs --tls_key_file"),
        ({**files, "tls_ca_file": ""}, "needs --tls_ca_file"),
        ({"tls_server_name": "job.example"}, "--tls_server_name applies only with"),
        ({**files, "tls_key_file": str(tmp_path / "none.key")}, "--tls_key_file"),
        ({**files, "tls_ca_file": str(certs / "job.ext")}, "is not a PEM file"),
    ):
        with pytest.raises(SpecError, match=message):
            JobSpec(**base, **given, platform="local").resolve()
