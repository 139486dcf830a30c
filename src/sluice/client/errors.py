"""One exception hierarchy for every way a call to the sluice API can fail.

Why one: a notebook user writes `except sluice.client.NotFoundError`, and the CLI maps each class
to an exit code in one place, instead of both parsing HTTP statuses. Every error carries the
server's own words (`detail`) and, for bad input, each bad field with its problem.
"""

from __future__ import annotations

from typing import Any

from sluice.spec.errors import FieldProblem


class SluiceError(Exception):
    """A failed call. `status` is the HTTP status (None: no answer came back), `error` the
    server's kind of failure ("not found", "invalid spec", ...), `detail` its words and
    `problems` each bad field of a 422, as the server named them."""

    def __init__(
        self, message: str, *, status: int | None = None, error: str = "", detail: str = "", problems: Any = ()
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.detail = detail
        self.problems: list[FieldProblem] = list(problems)


class BadRequestError(SluiceError):
    """The request was refused for its content (400, 413, 422): `problems` names the fields."""


class UnauthorizedError(SluiceError):
    """401: no token, or one the server does not know."""


class ForbiddenError(SluiceError):
    """403: the token is valid but may not do this (e.g. an admin-only call)."""


class NotFoundError(SluiceError):
    """404: no such job, dataset, tenant, queue or node (or it is another tenant's)."""


class ConflictError(SluiceError):
    """409: the thing exists already, or is in a state that forbids the call."""


class UnavailableError(SluiceError):
    """503: the server could not keep the change now (nothing was kept); retry later."""


class UnreachableError(SluiceError):
    """No answer at all: the server is down, or the URL is wrong."""


class ProtocolError(SluiceError):
    """The server answered something this client cannot read (a bug, or not a sluice server)."""


class WaitTimeout(SluiceError, TimeoutError):
    """`Client.wait` gave up before the job ended; `job` is how it was last seen."""

    def __init__(self, message: str, job: Any) -> None:
        super().__init__(message)
        self.job = job


_BY_STATUS: dict[int, type[SluiceError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    413: BadRequestError,
    422: BadRequestError,
    503: UnavailableError,
}


def from_response(status: int, body: Any, reason: str = "") -> SluiceError:
    """The error for an HTTP failure whose (decoded) body is the API's error shape:
    `{"error", "detail"}` or, for bad input, `{"error", "problems": [{"field", "problem"}]}`."""
    if not isinstance(body, dict):
        body = {"detail": str(body or reason)}
    error = str(body.get("error", "") or reason)
    detail = str(body.get("detail", "") or "")
    raw = body.get("problems") or []
    problems = [
        FieldProblem(str(p.get("field", "?")), str(p.get("problem", "")))
        for p in (raw if isinstance(raw, list) else [])
        if isinstance(p, dict)
    ]
    if problems:
        message = f"{error or 'invalid request'}: " + "; ".join(str(p) for p in problems)
    else:
        message = detail or error or f"HTTP {status}"
    cls = _BY_STATUS.get(status, SluiceError)
    return cls(message, status=status, error=error, detail=detail, problems=problems)
