import pytest
from elasticdl.common.ps_count_request import ACCEPTED, RECEIVED, PSCountOutcome, PSCountRequest


def test_request_and_outcome_travel_as_text():
    request = PSCountRequest("r1", 3)
    assert PSCountRequest.decode(request.encode()) == request
    outcome = PSCountOutcome("r1", ACCEPTED, "changing 1 -> 3")
    assert PSCountOutcome.decode(outcome.encode()) == outcome
    assert outcome.answered and not PSCountOutcome("r1", RECEIVED).answered


@pytest.mark.parametrize(
    "text, field",
    [
        ("not json", "JSON object"),
        ("[1]", "JSON object"),
        ('{"num_ps": 2}', "'id'"),
        ('{"id": "r", "num_ps": "2"}', "'num_ps'"),
        ('{"id": "r", "num_ps": true}', "'num_ps'"),
    ],
)
def test_a_malformed_request_is_one_line_naming_the_field(text, field):
    with pytest.raises(ValueError, match=field) as e:
        PSCountRequest.decode(text)
    assert "\n" not in str(e.value)


def test_an_outcome_of_unknown_state_is_refused():
    with pytest.raises(ValueError):
        PSCountOutcome.decode('{"id": "r", "state": "maybe"}')
