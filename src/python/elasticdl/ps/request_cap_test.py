"""A PS caps requests at what its model needs: real PS servers and clients over real gRPC and
the real local push channel on 127.0.0.1."""
import grpc
import numpy as np
import pytest
from elasticdl.common import local_channel as lc
from elasticdl.common import message_caps
from elasticdl.common import shared_memory as shm
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.ps.server import PSConfig, PSServer
from elasticdl.worker.ps_client import PSClient

MODEL = {"dense/kernel": np.ones((64, 16), np.float32), "dense/bias": np.zeros(16, np.float32)}
DENSE_BYTES = sum(v.nbytes for v in MODEL.values())


@pytest.fixture
def ps():
    server = PSServer(
        PSConfig(port=0, bind_host="127.0.0.1", use_async=True, minibatch_size=8), secret=None
    )
    server.start()
    yield server
    server.stop(grace_s=0)


def test_the_cap_follows_the_model_and_the_minibatch():
    assert message_caps.ps_cap(1000, [], 8) == 2 * 1000 + message_caps.BASE_BYTES
    rows = 8 * message_caps.EMBEDDING_IDS_PER_RECORD * (4 * 16 + 8)
    assert message_caps.ps_cap(1000, [16], 8) == 2 * (1000 + rows) + message_caps.BASE_BYTES
    assert message_caps.ps_cap(10**12, [], 8) == message_caps.TRANSPORT_MAX_BYTES
    assert message_caps.master_cap(512, evaluates=False) == message_caps.BASE_BYTES
    assert message_caps.master_cap(512, evaluates=True) == message_caps.BASE_BYTES + 512 * (
        message_caps.EVAL_BYTES_PER_RECORD
    )


def test_an_oversized_push_is_refused_and_normal_ones_go_on(ps):
    client = PSClient([f"127.0.0.1:{ps.port}"], retry_timeout=5, shared_memory=False)
    client.push_model(MODEL)  # before the model: only the transport ceiling applies
    cap, why = ps.request_cap()
    assert cap == message_caps.ps_cap(DENSE_BYTES, [], 8) and f"{DENSE_BYTES} dense bytes" in why
    grads = {n: np.full_like(v, 0.5) for n, v in MODEL.items()}
    assert client.push_gradients(grads, learning_rate=0.1).accepted
    version = ps.params.version
    before = {n: v.copy() for n, v in ps.params.dense.items()}
    # A gradient far larger than anything the model has: refused before it is parsed.
    huge = {**grads, "dense/kernel": np.zeros(cap // 4 + 1, np.float32)}
    with pytest.raises(grpc.RpcError) as refused:
        client.push_gradients(huge, learning_rate=0.1)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = refused.value.details()
    assert "push_gradients" in details and f"cap of {cap} bytes" in details and why in details
    assert ps.params.version == version
    for name, value in before.items():
        np.testing.assert_array_equal(ps.params.dense[name], value)
    assert client.push_gradients(grads, learning_rate=0.1).accepted  # the PS carries on
    assert ps.params.version == version + 1
    client.close()


@pytest.mark.skipif(shm.default_directory() is None, reason="needs /dev/shm and memfd")
def test_the_local_channel_applies_the_same_cap(ps):
    client = PSClient([f"127.0.0.1:{ps.port}"], retry_timeout=5, shared_memory=True)
    client.push_model(MODEL)
    client.pull_dense_parameters(force=True)
    client.set_dense_layout(MODEL)
    grads = {n: np.full_like(v, 0.5) for n, v in MODEL.items()}
    assert client.push_gradients(grads, learning_rate=0.1).accepted
    link = client._links[0].shared
    assert link is not None and link.channel is not None
    cap, _ = ps.request_cap()
    version = ps.params.version
    big = pb.PushGradientsRequest(shared_memory_region=link.region_id)
    big.gradients.dense_parameters["dense/bias"].content = b"\0" * (cap + 1)
    with pytest.raises(lc.LocalChannelError) as refused:
        link.channel.call(lc.PUSH, big.SerializeToString())
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"cap of {cap} bytes" in refused.value.details()
    assert ps.params.version == version
    assert client.push_gradients(grads, learning_rate=0.1).accepted
    client.close()


def test_every_method_is_capped_the_wire_ones_and_the_generated_ones(ps):
    client = PSClient([f"127.0.0.1:{ps.port}"], retry_timeout=5, shared_memory=False)
    client.push_model(MODEL)
    cap, why = ps.request_cap()
    channel = grpc.insecure_channel(f"127.0.0.1:{ps.port}")
    oversized = b"\n" + b"\xff" * 4 + b"\x0f" + b"\0" * (cap + 16)  # never parsed
    for method in (
        "pull_embedding_vectors",
        "push_gradients",
        "push_model",
        "pull_dense_parameters",
    ):
        call = channel.unary_unary(f"/elasticdl.Pserver/{method}")
        with pytest.raises(grpc.RpcError) as refused:
            call(oversized, timeout=30)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, method
        assert f"{method}: a request of {len(oversized)} bytes" in refused.value.details()
        assert why in refused.value.details()
    with pytest.raises(grpc.RpcError) as unknown:
        channel.unary_unary("/elasticdl.Pserver/no_such_method")(b"", timeout=30)
    assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED
    # Under the cap the same methods serve.
    pulled = client.pull_dense_parameters(force=True)
    np.testing.assert_array_equal(pulled.parameters["dense/kernel"], MODEL["dense/kernel"])
    channel.close()
    client.close()
