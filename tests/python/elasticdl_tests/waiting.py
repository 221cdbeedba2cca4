"""Waiting for a condition in tests that drive real processes, clusters and nodes."""
from __future__ import annotations

import time

import pytest


def wait_for(predicate, timeout: float, what: str, diagnose=lambda: "", interval: float = 0.5):
    """predicate()'s first truthy value, polled every `interval` seconds; the test fails after
    `timeout` seconds with `what` and diagnose()'s text."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}\n{diagnose()}")
        time.sleep(interval)
