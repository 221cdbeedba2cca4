"""The master acts on each PS count request written on its pod once, answers beside it, and a
master started again in the same pod does not run a request again."""

from elasticdl.common.ps_count_request import (
    ACCEPTED,
    OUTCOME_ANNOTATION,
    RECEIVED,
    REFUSED,
    REQUEST_ANNOTATION,
    PSCountOutcome,
    PSCountRequest,
)
from elasticdl.master.ps_count_requests import PSCountRequests
from elasticdl.master.ps_rescale import PSChange, RescaleRefused


class FakeRescaler:
    def __init__(self, num_ps=1, refuse=""):
        self.num_ps, self.refuse = num_ps, refuse
        self.asked: list[int] = []

    def request(self, num_ps):
        self.asked.append(num_ps)
        if self.refuse:
            raise RescaleRefused(self.refuse)
        change = PSChange(len(self.asked), self.num_ps, num_ps)
        self.num_ps = num_ps
        return change


class Pod:
    """The master pod's annotations, with every write kept."""

    def __init__(self):
        self.annotations: dict[str, str] = {}
        self.writes: list[dict] = []

    def read(self):
        return dict(self.annotations)

    def write(self, update):
        self.writes.append(dict(update))
        self.annotations.update(update)

    def ask(self, rid, num_ps):
        self.annotations[REQUEST_ANNOTATION] = PSCountRequest(rid, num_ps).encode()

    def outcome(self):
        return PSCountOutcome.decode(self.annotations[OUTCOME_ANNOTATION])


def _requests(pod, rescaler):
    return PSCountRequests(rescaler, pod.read, pod.write)


def test_a_request_is_acted_on_once_and_answered_under_its_id():
    pod, rescaler = Pod(), FakeRescaler()
    requests = _requests(pod, rescaler)
    assert requests.poll_once() is None  # nothing asked
    pod.ask("a", 2)
    assert requests.poll_once().state == ACCEPTED
    assert rescaler.asked == [2]
    assert pod.outcome().id == "a" and "1 -> 2" in pod.outcome().message
    # "received" went out before the change started: the record a restarted master reads.
    assert PSCountOutcome.decode(pod.writes[0][OUTCOME_ANNOTATION]).state == RECEIVED
    for _ in range(3):  # the same id seen again: nothing runs
        assert requests.poll_once() is None
    pod.ask("b", 1)
    assert requests.poll_once().state == ACCEPTED
    assert rescaler.asked == [2, 1]


def test_a_refusal_is_answered_with_the_rescalers_reason():
    pod = Pod()
    pod.ask("a", 1)
    outcome = _requests(pod, FakeRescaler(refuse="the job runs 1 PS already")).poll_once()
    assert outcome.state == REFUSED and outcome.message == "the job runs 1 PS already"
    pod.ask("b", 2)
    outcome = _requests(pod, None).poll_once()  # a job without PS
    assert outcome.state == REFUSED and "ParameterServerStrategy" in outcome.message


def test_a_restarted_master_does_not_run_a_request_again():
    pod, first = Pod(), FakeRescaler()
    pod.ask("a", 2)
    _requests(pod, first).poll_once()
    again = FakeRescaler(num_ps=2)
    assert _requests(pod, again).poll_once() is None  # answered: nothing to do
    assert again.asked == []


def test_a_request_its_master_died_taking_is_refused_not_run_again():
    pod, rescaler = Pod(), FakeRescaler()
    pod.ask("a", 2)
    pod.write({OUTCOME_ANNOTATION: PSCountOutcome("a", RECEIVED).encode()})
    outcome = _requests(pod, rescaler).poll_once()
    assert outcome.state == REFUSED and "restarted" in outcome.message
    assert rescaler.asked == []
    assert pod.outcome().state == REFUSED


def test_a_malformed_request_is_ignored():
    pod, rescaler = Pod(), FakeRescaler()
    pod.annotations[REQUEST_ANNOTATION] = '{"num_ps": 2}'
    requests = _requests(pod, rescaler)
    assert requests.poll_once() is None and requests.poll_once() is None
    assert rescaler.asked == [] and OUTCOME_ANNOTATION not in pod.annotations
