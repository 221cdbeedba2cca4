"""Calls from the client to a running local job's master (``elasticdl scale-ps``): its address
and secret come from the job directory (``status.json``'s master port, ``job_secret``), the
call carries the secret and, where the job has certificates, travels over its TLS."""

from __future__ import annotations

import types
from pathlib import Path

from elasticdl.common import auth, tls
from elasticdl.common.job_dir import JOB_SPEC_FILE, SECRET_FILE, STATUS_FILE
from elasticdl.jobs.errors import ClientError
from elasticdl.jobs.local_job_dir import read_json

# The local platform's replicas and master listen on the loopback interface.
LOCAL_MASTER_HOST = "127.0.0.1"
CALL_TIMEOUT_S = 30.0
_TLS_FIELDS = ("tls_cert_file", "tls_key_file", "tls_ca_file", "tls_server_name")


def scale_ps(directory: Path, name: str, num_ps: int, timeout: float | None = None) -> str:
    """Ask the master of the local job in ``directory`` to run ``num_ps`` PS; returns its
    one-line answer. Raises ``ClientError`` with the master's reason when it refuses."""
    import grpc

    status = read_json(directory / STATUS_FILE) or {}
    port = (status.get("master") or {}).get("port")
    if status.get("phase") != "Running" or not port:
        raise ClientError(
            f"job {name} is {status.get('phase') or 'not started'}: its PS count can change only "
            f"while it runs; see 'elasticdl status {name}'"
        )
    try:
        secret = auth.read_secret_file(directory / SECRET_FILE)
    except OSError as e:
        raise ClientError(f"cannot read job {name}'s secret: {e}") from None
    # The generated modules belong to the framework wheel (the client wheel's directory cannot
    # own protos/); the client PEX lists them itself, and a client installed from wheels runs
    # local jobs beside the framework, which has them.
    try:
        from elasticdl.proto import elasticdl_pb2 as pb  # pants: no-infer-dep
        from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc  # pants: no-infer-dep
    except ImportError:
        raise ClientError(
            "scale-ps on a local job needs the ElasticDL framework in this Python: "
            "pip install elasticdl (or run the client PEX)"
        ) from None
    spec = read_json(directory / JOB_SPEC_FILE) or {}
    tls_config = tls.TLS.of(types.SimpleNamespace(**{f: spec.get(f) or "" for f in _TLS_FIELDS}))
    with tls.channel(f"{LOCAL_MASTER_HOST}:{port}", [], tls_config) as channel:
        stub = pb_grpc.MasterStub(auth.authenticated_channel(channel, secret))
        try:
            answer = stub.scale_ps(
                pb.ScalePSRequest(num_ps=num_ps), timeout=timeout or CALL_TIMEOUT_S
            )
        except grpc.RpcError as e:
            code = e.code()
            if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
                raise ClientError(e.details()) from None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                raise ClientError(
                    f"job {name}'s master predates scale-ps; resubmit the job to change its PS "
                    "count"
                ) from None
            raise ClientError(
                f"job {name}'s master at port {port} did not answer ({code.name}); see "
                f"'elasticdl status {name}'"
            ) from None
    return answer.message
