"""How a failed Kubernetes API call is reported: one exception type with a one-line message
(:class:`K8sApiError`), and :class:`K8sConfigError` for credentials that cannot be used."""

from __future__ import annotations

import json


class K8sConfigError(ValueError):
    """No usable Kubernetes credentials; the message says what was tried and how to fix it."""


class K8sApiError(RuntimeError):
    """A Kubernetes API call failed. ``status`` is the HTTP status (0 if none)."""

    def __init__(self, message: str, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def api_exception_class():
    from kubernetes.client.exceptions import ApiException

    return ApiException


def _describe_api_exception(exc) -> tuple[str, str]:
    """(reason, message) from an ApiException's Status body, falling back to its text."""
    reason, message = getattr(exc, "reason", "") or "", ""
    body = getattr(exc, "body", None)
    if body:
        try:
            data = json.loads(body)
            reason = data.get("reason") or reason
            message = data.get("message") or ""
        except (ValueError, TypeError, AttributeError):
            message = str(body)[:300]
    return str(reason), message


def api_error(exc, what: str) -> K8sApiError:
    status = int(getattr(exc, "status", 0) or 0)
    reason, message = _describe_api_exception(exc)
    text = f"{what} failed: HTTP {status} {reason}".rstrip()
    if message:
        text += f": {message}"
    return K8sApiError(text, status=status, reason=reason)
