"""Each PS link's routing and fallback on its own, against a fake stub and a fake local channel
(no PS), then PSClient's fan-out over links: which push is sent again, and how many times."""
import os

import grpc
import numpy as np
import pytest
from elasticdl.common import local_channel as lc
from elasticdl.common import shared_memory as shm
from elasticdl.common.push_wire import decode_push_answer
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.worker.ps_client import PackedGradients, PackedLayout, PSClient
from elasticdl.worker.ps_links import (
    ATTACH_MAX_DOUBLINGS,
    ATTACH_RETRY_PUSHES,
    PSLink,
    PushPart,
    PushRequest,
    SharedMemoryLink,
)

pytestmark = pytest.mark.skipif(shm.default_directory() is None, reason="needs /dev/shm")

TENSORS = {"a": (np.dtype(np.float32), (3,)), "b": (np.dtype(np.float32), (2, 2))}
GRADS = {"a": np.array([1.0, 2.0, 3.0], np.float32), "b": np.full((2, 2), 4.0, np.float32)}


def _error(code, details="fake"):
    return lc.LocalChannelError(code, details)  # a grpc.RpcError with code() and details()


class _Method:
    """A stub method: called, or `.future(...)`, it answers with `answer(request)`."""

    def __init__(self, answer):
        self.answer = answer
        self.requests = []

    def __call__(self, request, timeout=None):
        self.requests.append(_copy(request))
        return self.answer(request)

    def future(self, request, timeout=None):
        method = self

        class _Done:
            def result(self):
                return method(request, timeout)

        return _Done()


def _copy(msg):
    """What the PS would read: a push (a PushRequest) as its bytes parse."""
    if isinstance(msg, PushRequest):
        return pb.PushGradientsRequest.FromString(msg.SerializeToString())
    out = type(msg)()
    out.CopyFrom(msg)
    return out


class FakeStub:
    def __init__(self, attach=None, push=None, version=1):
        self.attach_shared_memory = _Method(attach or _refuse)
        self.push_gradients = _Method(push or (lambda req: _accepted(version)))
        self.detach_shared_memory = _Method(lambda req: None)
        self.open_stream_channel = _Method(
            lambda req: pb.OpenStreamChannelResponse(port=0, reason="not offered")
        )


def _refuse(req):
    return pb.AttachSharedMemoryResponse(attached=False, reason="another host")


def _attach(region_id=7, local_channel=""):
    return lambda req: pb.AttachSharedMemoryResponse(
        attached=True, region_id=region_id, local_channel=local_channel
    )


def _response(version=1) -> pb.PushGradientsResponse:
    return pb.PushGradientsResponse(accepted=True, version=version)


def _accepted(version=1):
    """What the stub's deserializer makes of the PS's answer."""
    return decode_push_answer(_response(version).SerializeToString())


def _raise(err):
    def answer(req):
        raise err

    return answer


class FakeChannel:
    """A local channel whose send or receive fails as told; otherwise the PS accepts."""

    def __init__(self, send_error=None, receive_error=None, version=1):
        self.send_error, self.receive_error, self.version = send_error, receive_error, version
        self.sent = []
        self.closed = False

    def send(self, kind, payload):
        if self.send_error is not None:
            raise self.send_error
        self.sent.append(pb.PushGradientsRequest.FromString(payload))

    def receive(self):
        if self.receive_error is not None:
            raise self.receive_error
        return _response(self.version).SerializeToString()

    def close(self):
        self.closed = True


def _link(stub=None):
    return PSLink(0, "127.0.0.1:1", stub or FakeStub(), worker_id=3, rpc_timeout=5.0)


def _attached(channel=None, region_id=7):
    link = _link(FakeStub(attach=_attach(region_id)))
    link.maybe_attach(TENSORS)
    assert link.shared is not None
    link.shared.channel = channel
    return link


def _part(dense=GRADS, **kw):
    return PushPart(pb.PushGradientsRequest(worker_id=3), dense=dense, **kw)


def _sent(req):
    """A push as its bytes parse (what the PS reads)."""
    if isinstance(req, PushRequest):
        return pb.PushGradientsRequest.FromString(req.SerializeToString())
    return req


def _in_message(req):
    req = _sent(req)
    return {
        n: np.frombuffer(t.content, np.float32) for n, t in req.gradients.dense_parameters.items()
    }


def _our_files():
    """This process's descriptors of link regions (a mapped region's mmap holds one)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"/memfd:{shm.FILE_PREFIX}w3-ps0-{os.getpid()}-"):
            found.append(target)
    return found


# ---------------------------------------------------------------------------------- attaching
def test_a_refusing_ps_is_asked_after_100_then_200_then_400_pushes():
    stub = FakeStub(attach=_refuse)
    link = _link(stub)
    asked_at = []
    for push in range(704):
        before = len(stub.attach_shared_memory.requests)
        link.maybe_attach(TENSORS)
        if len(stub.attach_shared_memory.requests) > before:
            asked_at.append(push)
    assert asked_at == [0, 101, 302, 703]
    assert link.shared is None and link.attach_refusals == 4
    assert _our_files() == []  # every refused region was removed
    # The wait stops doubling after ATTACH_MAX_DOUBLINGS refusals.
    link.attach_refusals, link.attach_countdown = ATTACH_MAX_DOUBLINGS + 5, 0
    link.maybe_attach(TENSORS)
    assert link.attach_countdown == ATTACH_RETRY_PUSHES << ATTACH_MAX_DOUBLINGS


def test_an_attach_error_counts_as_a_refusal_unless_the_ps_is_restarting():
    old = FakeStub(attach=_raise(_error(grpc.StatusCode.UNIMPLEMENTED, "old PS")))
    link = _link(old)
    link.maybe_attach(TENSORS)
    assert link.shared is None and link.attach_refusals == 1
    assert link.attach_countdown == ATTACH_RETRY_PUSHES
    restarting = FakeStub(attach=_raise(_error(grpc.StatusCode.UNAVAILABLE)))
    link = _link(restarting)
    link.maybe_attach(TENSORS)
    link.maybe_attach(TENSORS)  # asked again at the very next push, no refusal counted
    assert len(restarting.attach_shared_memory.requests) == 2
    assert link.shared is None and link.attach_refusals == 0 and link.attach_countdown == 0
    assert _our_files() == []


def test_attaching_sends_the_region_and_a_ps_without_dense_tensors_is_not_asked():
    link = _attached()
    req = link.stub.attach_shared_memory.requests[0]
    assert req.worker_id == 3 and req.token == link.shared.region.token
    assert sorted(s.name for s in req.slots) == ["a", "b"]
    # The creator's descriptor is closed once the PS answered; only the mapping's remains.
    assert link.shared.region_id == 7 and link.shared.region._fd is None
    assert len(_our_files()) == 1
    link.maybe_attach(TENSORS)  # attached: nothing more to ask
    assert len(link.stub.attach_shared_memory.requests) == 1
    empty = _link()
    empty.maybe_attach({})
    assert empty.stub.attach_shared_memory.requests == [] and empty.shared is None
    link.close()
    assert link.stub.detach_shared_memory.requests[0].region_id == 7 and link.shared is None


def test_a_channel_that_cannot_connect_leaves_pushes_on_grpc():
    link = _link(FakeStub(attach=_attach(local_channel="elasticdl-no-such-channel")))
    link.maybe_attach(TENSORS)
    assert link.shared is not None and link.shared.channel is None
    link.prepare_push(_part())
    assert link.request.shared_memory_region == 7 and not link.on_channel
    link.close()


# ---------------------------------------------------------------------------------- routing
def test_without_a_region_the_gradients_travel_in_the_message():
    link = _link()
    req = _sent(link.prepare_push(_part()))
    assert not req.shared_memory_region and not link.on_channel
    assert {n: v.tolist() for n, v in _in_message(req).items()} == {
        n: v.reshape(-1).tolist() for n, v in GRADS.items()
    }


def test_gradients_go_into_the_region_and_the_message_names_it():
    link = _attached()
    req = link.prepare_push(_part({"a": GRADS["a"]})).message
    assert req.shared_memory_region == 7 and list(req.shared_memory_missing) == ["b"]
    assert not req.gradients.dense_parameters and not link.on_channel
    np.testing.assert_array_equal(link.shared.region.gradient("a"), GRADS["a"])
    link.close()


def test_a_packed_block_goes_into_the_region_in_one_copy():
    link = _attached()
    packed = link.shared.region.packed()
    block = np.arange(packed.gradients.size, dtype=np.float32)
    req = link.prepare_push(_part(dense=None, block=block, entries=packed.entries)).message
    assert req.shared_memory_region == 7 and not req.shared_memory_missing
    np.testing.assert_array_equal(packed.gradients, block)
    # A block laid out otherwise (here "b" first) is written tensor by tensor.
    other = (("b", 0, 4, (2, 2)), ("a", 4, 3, (3,)))
    assert other != packed.entries
    link.prepare_push(_part(dense=None, block=block, entries=other))
    np.testing.assert_array_equal(link.shared.region.gradient("a"), block[4:7])
    np.testing.assert_array_equal(link.shared.region.gradient("b"), block[:4].reshape(2, 2))
    link.close()


def test_a_tensor_the_region_lacks_sends_the_whole_push_in_a_message():
    link = _attached(channel=FakeChannel())
    req = _sent(link.prepare_push(_part({**GRADS, "c": np.ones(5, np.float32)})))
    assert not req.shared_memory_region and not link.on_channel
    assert sorted(req.gradients.dense_parameters) == ["a", "b", "c"]
    link.close()


# ---------------------------------------------------------------------------------- fallback
def test_a_ps_that_lost_the_region_gets_the_push_in_a_message_and_a_new_attach():
    link = _attached()
    region = link.shared.region
    req = link.prepare_push(_part())
    again = link.reissue(req, _error(grpc.StatusCode.FAILED_PRECONDITION, "unknown region"))
    assert again is not None and not again.message.shared_memory_region
    assert not again.message.shared_memory_missing and again.message.worker_id == 3
    np.testing.assert_array_equal(_in_message(again)["b"], GRADS["b"].reshape(-1))
    assert link.shared is None and region.packed() is None  # dropped and unmapped
    link.maybe_attach(TENSORS)  # at once, not after a refusal's wait
    assert len(link.stub.attach_shared_memory.requests) == 2 and link.shared is not None
    link.close()


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INTERNAL]
)
def test_other_grpc_errors_are_not_resent(code):
    link = _attached()
    req = link.prepare_push(_part())
    assert link.reissue(req, _error(code)) is None
    assert link.shared is not None  # the region stays
    link.close()


def test_failed_precondition_on_a_message_is_not_resent():
    link = _link()
    req = link.prepare_push(_part())
    assert link.reissue(req, _error(grpc.StatusCode.FAILED_PRECONDITION)) is None


def test_the_channel_carries_a_push_naming_the_region():
    channel = FakeChannel(version=5)
    link = _attached(channel)
    link.prepare_push(_part())
    assert link.on_channel
    link.send()
    assert link.sent and channel.sent[0].shared_memory_region == 7
    assert link.receive().message.version == 5


def test_a_send_that_fails_leaves_the_push_to_a_message():
    channel = FakeChannel(send_error=_error(grpc.StatusCode.UNAVAILABLE, "broken pipe"))
    link = _attached(channel)
    link.prepare_push(_part())
    link.send()
    assert not link.sent
    req = _sent(link.in_message())
    assert not req.shared_memory_region and sorted(req.gradients.dense_parameters) == ["a", "b"]
    assert link.shared is None and channel.closed and not link.on_channel


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION])
def test_a_broken_channel_answer_asks_for_a_message(code):
    channel = FakeChannel(receive_error=_error(code))
    link = _attached(channel)
    link.prepare_push(_part())
    link.send()
    assert link.sent and link.receive() is None
    assert link.shared is not None  # dropped only when the message is made
    assert not link.in_message().message.shared_memory_region and link.shared is None


def test_the_ps_verdict_on_the_channel_propagates():
    channel = FakeChannel(receive_error=_error(grpc.StatusCode.INVALID_ARGUMENT, "bad push"))
    link = _attached(channel)
    link.prepare_push(_part())
    link.send()
    with pytest.raises(lc.LocalChannelError, match="bad push"):
        link.receive()
    link.close()


# ---------------------------------------------------------------------------------- fan-out
def _client_with_fakes(stubs, channels):
    """A PSClient whose links talk to fake stubs; PS i attached with `channels[i]` unless None
    (then it has no region)."""
    client = PSClient([f"127.0.0.1:{i + 1}" for i in range(len(stubs))], shared_memory=False)
    for i, (stub, channel) in enumerate(zip(stubs, channels)):
        client._stubs[i] = client._links[i].stub = stub
        if channel is not None:
            region = shm.SharedRegion.create(TENSORS, tag=f"w3-ps{i}")
            region.unlink()
            client._links[i].shared = SharedMemoryLink(region, 10 + i, channel)
    return client


def _pushes(stub):
    return stub.push_gradients.requests


def test_only_the_push_on_the_broken_channel_is_sent_again_and_only_once():
    stubs = [FakeStub(version=11), FakeStub(version=22), FakeStub(version=33)]
    broken = FakeChannel(receive_error=_error(grpc.StatusCode.UNAVAILABLE))
    fine = FakeChannel(version=22)
    client = _client_with_fakes(stubs, [broken, fine, None])
    grads = {"a": GRADS["a"]}
    owner = client.ps_of_param("a")
    result = client.push_gradients(grads, learning_rate=0.5)
    assert result.accepted and result.versions == {0: 11, 1: 22, 2: 33}
    assert len(broken.sent) == 1 and len(fine.sent) == 1
    assert len(_pushes(stubs[0])) == 1 and not _pushes(stubs[0])[0].shared_memory_region
    assert _pushes(stubs[1]) == [] and len(_pushes(stubs[2])) == 1
    if owner == 0:  # the re-sent message carries the dense gradients
        np.testing.assert_array_equal(_in_message(_pushes(stubs[0])[0])["a"], GRADS["a"])
    assert client.shared_memory_ps() == [1]
    client.close()


def test_a_failed_send_is_sent_again_once_by_grpc():
    stubs = [FakeStub(version=4), FakeStub(version=4)]
    unsendable = FakeChannel(send_error=_error(grpc.StatusCode.UNAVAILABLE))
    client = _client_with_fakes(stubs, [unsendable, FakeChannel(version=4)])
    assert client.push_gradients({}, learning_rate=0.5).accepted
    assert len(_pushes(stubs[0])) == 1 and _pushes(stubs[1]) == []
    assert client.shared_memory_ps() == [1]
    client.close()


def test_a_relaunched_ps_gets_its_push_twice_by_grpc_and_the_others_once():
    lost = FakeStub(version=6)
    answers = iter([_error(grpc.StatusCode.FAILED_PRECONDITION, "unknown region"), None])

    def first_fails(req):
        err = next(answers)
        if err is not None:
            raise err
        return _accepted(6)

    lost.push_gradients.answer = first_fails
    kept = FakeStub(version=6)
    client = _client_with_fakes([lost, kept], [None, FakeChannel(version=6)])
    client._links[0].shared = SharedMemoryLink(
        shm.SharedRegion.create(TENSORS, tag="w3-ps0"), 10, None
    )
    client._links[0].shared.region.unlink()
    assert client.push_gradients({}).accepted
    first, second = _pushes(lost)
    assert first.shared_memory_region == 10 and not second.shared_memory_region
    assert _pushes(kept) == [] and client.shared_memory_ps() == [1]
    client.close()


def test_a_resent_push_that_fails_again_is_not_sent_a_third_time():
    stub = FakeStub(push=_raise(_error(grpc.StatusCode.FAILED_PRECONDITION, "still unknown")))
    broken = FakeChannel(receive_error=_error(grpc.StatusCode.FAILED_PRECONDITION))
    client = _client_with_fakes([stub], [broken])
    with pytest.raises(grpc.RpcError, match="still unknown"):
        client.push_gradients({"a": GRADS["a"]})
    assert len(broken.sent) == 1 and len(_pushes(stub)) == 1
    client.close()


def test_packed_gradients_reach_each_ps_region_through_its_link():
    stubs = [FakeStub(), FakeStub()]
    channels = [FakeChannel(), FakeChannel()]
    client = _client_with_fakes(stubs, channels)
    layout = PackedLayout(
        tuple((i, client._links[i].shared.region.packed().entries) for i in range(2))
    )
    assert client.packed_layout() is None  # no dense layout was set: not offered
    blocks = {i: np.full(7, float(i + 1), np.float32) for i in range(2)}
    assert client.push_gradients(PackedGradients(layout, blocks)).accepted
    for i in range(2):
        np.testing.assert_array_equal(client._links[i].shared.region.packed().gradients, i + 1)
        assert channels[i].sent[0].shared_memory_region == 10 + i
    client.close()


def test_a_push_cut_short_by_another_ps_does_not_leave_an_answer_unread():
    # PS 0's push went out on its channel; PS 1 fails it before PS 0's answer is read. Reading
    # that answer at the next push would pair it with the wrong push: PS 0 attaches anew.
    stubs = [FakeStub(), FakeStub(push=_raise(_error(grpc.StatusCode.INVALID_ARGUMENT, "bad")))]
    channel = FakeChannel()
    client = _client_with_fakes(stubs, [channel, None])
    with pytest.raises(grpc.RpcError, match="bad"):
        client.push_gradients({})
    assert len(channel.sent) == 1 and channel.closed and client.shared_memory_ps() == []
    assert client._links[0].request is None  # nothing of the push is kept
    client.close()


def test_a_finished_push_keeps_its_channel_and_nothing_of_the_push():
    channel = FakeChannel()
    client = _client_with_fakes([FakeStub()], [channel])
    assert client.push_gradients({"a": GRADS["a"]}).accepted
    assert not channel.closed and client.shared_memory_ps() == [0]
    assert client._links[0].request is None and client._links[0]._part is None
    client.close()


def test_the_worker_writes_pushes_with_the_codec_elasticdl_ops_loaded():
    from elasticdl.common import push_wire
    from elasticdl.ops import _backend

    assert push_wire._native is _backend.native
