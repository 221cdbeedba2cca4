"""The master's side of ``elasticdl scale-ps`` where the client cannot call its gRPC port
(Kubernetes): it reads the request the client wrote on the master pod
(:mod:`elasticdl.common.ps_count_request`), runs it through the same
:class:`~elasticdl.master.ps_rescale.PSRescaler` as the ``scale_ps`` RPC, and writes the
outcome back beside it.

A request id is acted on once. The outcome annotation is the record of what was taken: the
master writes ``received`` for an id before acting on it, then ``accepted`` or ``refused``. A
master that starts again in the same pod (its container restarted) finds the id answered and
does nothing, or still ``received`` (it died while taking it) and answers it refused without
running it again: the status shows whether the change happened.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from elasticdl.common.ps_count_request import (
    ACCEPTED,
    OUTCOME_ANNOTATION,
    RECEIVED,
    REFUSED,
    REQUEST_ANNOTATION,
    PSCountOutcome,
    PSCountRequest,
)
from elasticdl.master import ps_rescale
from elasticdl.master.ps_rescale import PSRescaler, RescaleRefused

logger = logging.getLogger(__name__)

POLL_INTERVAL_S = 1.0


class PSCountRequests:
    def __init__(
        self,
        rescaler: PSRescaler | None,
        read_annotations: Callable[[], dict | None],
        write_annotations: Callable[[dict], object],
    ) -> None:
        """``read_annotations()``: the master pod's annotations now (None: unreadable);
        ``write_annotations(d)``: merge ``d`` into them. ``rescaler`` None: a job whose PS
        count cannot change (no PS, not training)."""
        self._rescaler = rescaler
        self._read = read_annotations
        self._write = write_annotations
        self._bad_text = ""  # a malformed request is logged once, not every poll

    def poll_once(self) -> PSCountOutcome | None:
        """Act on the request on the pod if it is new; returns the outcome written, if any."""
        annotations = self._read()
        text = (annotations or {}).get(REQUEST_ANNOTATION)
        if not text:
            return None
        try:
            request = PSCountRequest.decode(text)
        except ValueError as e:
            if text != self._bad_text:
                logger.warning("Ignoring the PS count request: %s", e)
                self._bad_text = text
            return None
        last = PSCountOutcome.of(annotations)
        if last is not None and last.id == request.id:
            if last.answered:
                return None
            # A previous life of this master took it and did not say what came of it.
            return self._answer(
                PSCountOutcome(
                    request.id,
                    REFUSED,
                    "the master restarted while taking this request; see 'elasticdl status' "
                    "for the PS count now, and ask again if it is not what you asked for",
                )
            )
        self._write({OUTCOME_ANNOTATION: PSCountOutcome(request.id, RECEIVED).encode()})
        return self._answer(self._act(request))

    def _act(self, request: PSCountRequest) -> PSCountOutcome:
        try:
            change = ps_rescale.ask(self._rescaler, request.num_ps)
        except RescaleRefused as e:
            return PSCountOutcome(request.id, REFUSED, str(e))
        return PSCountOutcome(request.id, ACCEPTED, change.accepted_message)

    def _answer(self, outcome: PSCountOutcome) -> PSCountOutcome:
        self._write({OUTCOME_ANNOTATION: outcome.encode()})
        logger.info("PS count request %s %s: %s", outcome.id, outcome.state, outcome.message)
        return outcome

    def run(self, stop: threading.Event, interval_s: float = POLL_INTERVAL_S) -> None:
        """Poll until ``stop`` is set (the master's thread for it)."""
        while not stop.wait(interval_s):
            try:
                self.poll_once()
            except Exception as e:  # API trouble: the next poll tries again
                logger.warning("Cannot read or answer the PS count request: %s", e)
