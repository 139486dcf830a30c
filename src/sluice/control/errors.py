"""Errors the control plane raises to its callers (the API maps them to HTTP statuses)."""

from __future__ import annotations

from sluice.store.base import StoreUnavailable


def some(items: list[str], most: int = 5) -> str:
    """The first few of `items`, comma-separated, `...` when there are more: how a refusal
    names the jobs in the way."""
    return ", ".join(items[:most]) + (", ..." if len(items) > most else "")


class ControlError(Exception):
    """Base for errors a caller can act on."""


class Unauthorized(ControlError):
    """No token, or a token nobody holds (HTTP 401)."""


class Forbidden(ControlError):
    """A valid caller asking for something its role may not do (HTTP 403)."""


class NotFound(ControlError):
    """No such object — or one the caller may not see; the two are indistinguishable (HTTP 404)."""


class Conflict(ControlError):
    """The request clashes with the object's state (HTTP 409)."""


class TooBusy(ControlError):
    """The caller already has as many of this request under way as it may (HTTP 429); the
    request changed nothing and may be retried once one of them has finished."""


# The store's own error, named here so callers of the control plane (the API) need not reach
# into the store: the state cannot be written now (disk full, read-only home). HTTP 503.
Unavailable = StoreUnavailable
