"""CappedHandlers: the cap on a server's generic handlers, over real gRPC on 127.0.0.1."""
from concurrent import futures

import grpc
import pytest
from elasticdl.common import auth, message_caps

SECRET = "s3cret"


class CountingHandlers(grpc.GenericRpcHandler):
    """`/t.S/echo` answers its request (parsed as UTF-8); counts lookups and parses."""

    def __init__(self):
        self.lookups, self.parsed = 0, []

    def service(self, handler_call_details):
        self.lookups += 1
        if handler_call_details.method != "/t.S/echo":
            return None

        def parse(data: bytes) -> str:
            self.parsed.append(len(data))
            return data.decode()

        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: request.encode(),
            request_deserializer=parse,
        )


@pytest.fixture
def served():
    inner = CountingHandlers()
    cap = [16]
    capped = message_caps.CappedHandlers([inner], lambda: (cap[0], "the test's cap"))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2),
        interceptors=[auth.TokenServerInterceptor(SECRET)],
    )
    server.add_generic_rpc_handlers((capped,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield inner, cap, capped, channel
    channel.close()
    server.stop(0)


def _call(channel, method, payload, token=SECRET):
    metadata = [(auth.TOKEN_METADATA_KEY, token)] if token else []
    return channel.unary_unary(method)(payload, timeout=30, metadata=metadata)


def test_requests_over_the_cap_are_refused_unparsed_and_the_cap_is_read_each_time(served):
    inner, cap, _, channel = served
    assert _call(channel, "/t.S/echo", b"under") == b"under"
    with pytest.raises(grpc.RpcError) as refused:
        _call(channel, "/t.S/echo", b"x" * 17)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused.value.details() == message_caps.oversize_message(
        "echo", 17, 16, "the test's cap"
    )
    assert inner.parsed == [5]  # the oversized request never reached the parser
    cap[0] = 64  # the limit moves (a PS that received its model): the next call sees it
    assert _call(channel, "/t.S/echo", b"x" * 17) == b"x" * 17


def test_each_method_is_looked_up_once_and_unknown_names_are_not_kept(served):
    inner, _, capped, channel = served
    for _ in range(3):
        assert _call(channel, "/t.S/echo", b"a") == b"a"
    assert inner.lookups == 1
    for _ in range(3):
        with pytest.raises(grpc.RpcError) as unknown:
            _call(channel, "/t.S/nothing", b"a")
        assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert inner.lookups == 4  # asked each time: a caller cannot grow the table with names
    assert list(capped._by_method) == ["/t.S/echo"]


def test_the_token_is_checked_before_the_size(served):
    inner, _, _, channel = served
    # An outsider learns nothing of the cap, and its oversized request is not parsed.
    with pytest.raises(grpc.RpcError) as denied:
        _call(channel, "/t.S/echo", b"x" * 17, token="wrong")
    assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "cap" not in denied.value.details()
    with pytest.raises(grpc.RpcError) as denied:
        _call(channel, "/t.S/echo", b"short", token=None)
    assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert inner.parsed == [5]


def test_the_collector_takes_a_generated_registration():
    from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc

    collector = message_caps.HandlerCollector()
    pb_grpc.add_PserverServicer_to_server(pb_grpc.PserverServicer(), collector)
    assert collector.handlers

    class Details:
        method = "/elasticdl.Pserver/push_model"

    assert any(h.service(Details()) is not None for h in collector.handlers)
