"""One error shape for every failure, so clients (and the CLI) need one parser.

Bad input is `422 {"error": "invalid spec", "problems": [{"field", "problem"}]}` for a job
spec, whether the spec validator or FastAPI's own body parsing caught it, and `"invalid
request"` for any other body, query or path parameter; everything else is
`{"error": <kind>, "detail": <words>}` with the status the control plane's error implies.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sluice.control.errors import Conflict, ControlError, Forbidden, NotFound, TooBusy, Unauthorized, Unavailable
from sluice.spec import SpecError
from sluice.spec.loading import problem_words

_STATUS: list[tuple[type[ControlError], int, str]] = [
    (Unauthorized, 401, "unauthorized"),
    (Forbidden, 403, "forbidden"),
    (NotFound, 404, "not found"),
    (Conflict, 409, "conflict"),
    (TooBusy, 429, "too many requests"),
]

# Where FastAPI puts the parameter; the client thinks in field names, not request parts.
_LOC_PREFIXES = {"body", "query", "path", "header"}


def problem_list(errors: list[Any]) -> list[dict[str, str]]:
    """pydantic/FastAPI error entries as {field, problem} with dotted field paths."""
    out = []
    for e in errors:
        loc = [str(p) for p in e.get("loc", ()) if not str(p).startswith("function-")]
        if loc and loc[0] in _LOC_PREFIXES:
            where, loc = loc[0], loc[1:]
        else:
            where = "body"
        if e.get("type") == "json_invalid":
            msg = f"not valid JSON: {e.get('ctx', {}).get('error', e.get('msg', 'invalid'))}"
            loc = []
        else:
            msg = problem_words(e)
        out.append({"field": ".".join(loc) or f"({where})", "problem": msg})
    return out


def error_body(kind: str, detail: str) -> dict[str, str]:
    return {"error": kind, "detail": detail}


def _kind(request: Request) -> str:
    """A job spec (the body of POST /v1/jobs) is "invalid spec"; any other body, and a bad query
    or path parameter anywhere (GET /v1/jobs?limit=-1), is "invalid request"."""
    spec_body = request.method == "POST" and request.url.path.rstrip("/").endswith("/jobs")
    return "invalid spec" if spec_body else "invalid request"


def install(app: FastAPI) -> None:
    """Register the handlers that turn exceptions into the shapes above."""

    @app.exception_handler(SpecError)
    async def _spec(request: Request, exc: SpecError) -> JSONResponse:
        # The same kinds as below: `GET /v1/jobs/{id}/logs?replica=1` on the local engine said
        # "invalid spec", which the CLI printed above a problem with its --replica option.
        return JSONResponse({**exc.as_dict(), "error": _kind(request)}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": _kind(request), "problems": problem_list(list(exc.errors()))}, status_code=422)

    @app.exception_handler(ControlError)
    async def _control(_: Request, exc: ControlError) -> JSONResponse:
        for cls, status, kind in _STATUS:
            if isinstance(exc, cls):
                headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
                if status == 429:
                    headers = {"Retry-After": "5"}
                return JSONResponse(error_body(kind, str(exc) or kind), status_code=status, headers=headers)
        return JSONResponse(error_body("error", str(exc)), status_code=400)

    @app.exception_handler(Unavailable)
    async def _unavailable(_: Request, exc: Unavailable) -> JSONResponse:
        # Nothing of the request was kept; reads still work. Clients may retry later.
        return JSONResponse(error_body("unavailable", str(exc)), status_code=503, headers={"Retry-After": "5"})

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {401: "unauthorized", 404: "not found", 405: "method not allowed", 413: "too large"}.get(
            exc.status_code, "error"
        )
        return JSONResponse(
            error_body(kind, str(exc.detail)), status_code=exc.status_code, headers=getattr(exc, "headers", None)
        )
