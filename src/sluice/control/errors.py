"""Errors the control plane raises to its callers (the API maps them to HTTP statuses)."""

from __future__ import annotations


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
