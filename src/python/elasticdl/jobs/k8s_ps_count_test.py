"""The client's side of scale-ps on Kubernetes: the request written on the master pod, the
answer to it (not an older one) waited for, one-line errors naming the fix."""

import types

import pytest
from elasticdl.common.ps_count_request import (
    ACCEPTED,
    OUTCOME_ANNOTATION,
    RECEIVED,
    REFUSED,
    REQUEST_ANNOTATION,
    PSCountOutcome,
    PSCountRequest,
)
from elasticdl.jobs.errors import ClientError
from elasticdl.jobs.k8s_ps_count import request_ps_count
from elasticdl.k8s.client import K8sApiError

POD = "elasticdl-j-master"


class FakeK8s:
    """One master pod whose master answers on the ``answer_after``-th read."""

    namespace = "ns"

    def __init__(self, state=ACCEPTED, message="changing the PS count 1 -> 2", answer_after=2):
        self.annotations = {OUTCOME_ANNOTATION: PSCountOutcome("old", ACCEPTED, "old").encode()}
        self.state, self.message, self.answer_after = state, message, answer_after
        self.reads = 0
        self.exists = True
        self.patch_error: K8sApiError | None = None

    def annotate_pod(self, name, annotations):
        assert name == POD
        if self.patch_error is not None:
            raise self.patch_error
        self.annotations.update(annotations)
        return self.exists

    def get_pod(self, name):
        self.reads += 1
        if not self.exists:
            return None
        request = PSCountRequest.decode(self.annotations[REQUEST_ANNOTATION])
        if self.reads == 1:
            state, message = RECEIVED, ""
        elif self.reads >= self.answer_after:
            state, message = self.state, self.message
        else:
            state, message = RECEIVED, ""
        self.annotations[OUTCOME_ANNOTATION] = PSCountOutcome(request.id, state, message).encode()
        return types.SimpleNamespace(metadata=types.SimpleNamespace(annotations=self.annotations))


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def _ask(k8s, timeout=60.0, num_ps=2):
    clock = Clock()
    return request_ps_count(
        k8s, POD, "j", num_ps, timeout=timeout, request_id="r1", clock=clock, sleep=clock.sleep
    )


def test_the_request_is_written_on_the_master_pod_and_its_answer_returned():
    k8s = FakeK8s(answer_after=3)
    assert _ask(k8s) == "changing the PS count 1 -> 2"
    assert PSCountRequest.decode(k8s.annotations[REQUEST_ANNOTATION]) == PSCountRequest("r1", 2)
    assert k8s.reads == 3  # "received" was not taken for the answer, nor the old outcome


def test_a_refusal_is_a_client_error_with_the_masters_reason():
    k8s = FakeK8s(state=REFUSED, message="the job runs 2 PS already; ask for another num_ps")
    with pytest.raises(ClientError, match="runs 2 PS already"):
        _ask(k8s)


def test_no_answer_in_time_names_what_to_do():
    with pytest.raises(ClientError, match=r"did not answer .* in 5 s; .*--timeout"):
        _ask(FakeK8s(answer_after=10**6), timeout=5)


def test_a_user_without_patch_on_pods_is_told_so():
    k8s = FakeK8s()
    k8s.patch_error = K8sApiError("annotate pod: Forbidden", status=403)
    with pytest.raises(ClientError, match="needs 'patch' on pods in namespace ns"):
        _ask(k8s)


def test_a_master_pod_gone_is_one_line():
    k8s = FakeK8s()
    k8s.exists = False
    with pytest.raises(ClientError, match="is gone"):
        _ask(k8s)
