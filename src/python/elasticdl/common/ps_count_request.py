"""A request to change a job's PS count, written by the client where the master reads it, and
its outcome, written back by the master (``elasticdl scale-ps`` on Kubernetes, where the client
has no route to the master's gRPC port: both travel as annotations of the master pod, through
the Kubernetes API and its RBAC).

Each request carries an id the client chose; the master acts on an id once. The outcome
names the id it answers, so a client waits for its own answer and a master that starts again
in the same pod finds the requests it already took (:mod:`elasticdl.master.ps_count_requests`).
"""

from __future__ import annotations

import dataclasses
import json

REQUEST_ANNOTATION = "elasticdl.org/ps-count-request"
OUTCOME_ANNOTATION = "elasticdl.org/ps-count-outcome"

# The master took the request and has not answered yet; it answers with one of the others.
RECEIVED = "received"
ACCEPTED = "accepted"
REFUSED = "refused"
_STATES = (RECEIVED, ACCEPTED, REFUSED)


@dataclasses.dataclass(frozen=True)
class PSCountRequest:
    id: str
    num_ps: int

    def encode(self) -> str:
        return json.dumps({"id": self.id, "num_ps": self.num_ps}, sort_keys=True)

    @classmethod
    def decode(cls, text: str) -> "PSCountRequest":
        """Raises ``ValueError`` (one line) for anything but ``{"id": str, "num_ps": int}``."""
        data = _object(text, REQUEST_ANNOTATION)
        rid, num_ps = data.get("id"), data.get("num_ps")
        if not isinstance(rid, str) or not rid:
            raise ValueError(f"{REQUEST_ANNOTATION} has no 'id'; write it with elasticdl scale-ps")
        if isinstance(num_ps, bool) or not isinstance(num_ps, int):
            raise ValueError(f"{REQUEST_ANNOTATION} 'num_ps' must be an integer, got {num_ps!r}")
        return cls(rid, num_ps)


@dataclasses.dataclass(frozen=True)
class PSCountOutcome:
    id: str
    state: str
    message: str = ""

    @property
    def answered(self) -> bool:
        return self.state in (ACCEPTED, REFUSED)

    def encode(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def decode(cls, text: str) -> "PSCountOutcome":
        data = _object(text, OUTCOME_ANNOTATION)
        rid, state = data.get("id"), data.get("state")
        if not isinstance(rid, str) or state not in _STATES:
            raise ValueError(f"{OUTCOME_ANNOTATION} is not an outcome: {text[:80]!r}")
        return cls(rid, state, str(data.get("message") or ""))

    @classmethod
    def of(cls, annotations: dict | None) -> "PSCountOutcome | None":
        """The outcome a pod's annotations hold; None when there is none or it is unreadable."""
        text = (annotations or {}).get(OUTCOME_ANNOTATION)
        if not text:
            return None
        try:
            return cls.decode(text)
        except ValueError:
            return None


def _object(text: str, what: str) -> dict:
    try:
        data = json.loads(text)
    except (TypeError, ValueError):
        data = None
    if not isinstance(data, dict):
        raise ValueError(f"{what} must be a JSON object, got {str(text)[:80]!r}")
    return data
