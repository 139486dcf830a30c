"""Operational routes: liveness (unauthenticated) and Prometheus metrics (scoped by token)."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sluice.api.auth import bearer, plane_of
from sluice.api.metrics import EVERYONE, PUBLIC, Scope, scoped
from sluice.control.errors import Unauthorized, Unavailable

router = APIRouter(tags=["system"])


@router.get("/healthz", response_model=None)
def healthz(request: Request) -> dict[str, str] | JSONResponse:
    """200 while the API serves requests and its database answers (what `sluice up` waits
    for); 503 while the database does not, so a readiness probe or load balancer stops
    routing to a plane whose every read would fail. Unauthenticated, so the body names no
    host or path: the server log has the database's own words."""
    plane = plane_of(request)
    if plane.lost_database is not None:
        return JSONResponse(
            {
                "status": "stopped",
                "detail": "another plane took this plane's database or Ray namespace; it no longer reconciles",
            },
            status_code=503,
        )
    try:
        plane.store.ping()
    except Unavailable:
        return JSONResponse(
            {"status": "unavailable", "detail": "the database does not answer; the server log says why"},
            status_code=503,
            headers={"Retry-After": "5"},
        )
    return {"status": "ok"}


def metrics_scope(request: Request, creds: HTTPAuthorizationCredentials | None) -> Scope:
    """No token: cluster-wide series only. The `metrics_token` setting or an admin token:
    every tenant's series. A tenant's token: its own. Anything else: 401."""
    if creds is None and "authorization" not in request.headers:
        return PUBLIC
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:  # a misconfigured scraper
        raise Unauthorized("malformed credentials: send 'Authorization: Bearer <token>'")
    plane = plane_of(request)
    token = plane.settings.metrics_token
    if token and hmac.compare_digest(creds.credentials.encode(), token.encode()):
        return EVERYONE
    tenant = plane.authenticate(creds.credentials)
    return EVERYONE if tenant.admin else Scope(tenant=tenant.name)


@router.get("/metrics", response_class=Response)
def metrics(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Response:
    """Prometheus text format (docs/metrics.md). Without a token: jobs by phase, decisions,
    round times and nodes; with a metrics, admin or tenant token also per-job, tenant, queue
    and dataset series (a tenant's token: only its own)."""
    scope = metrics_scope(request, creds)
    return Response(generate_latest(scoped(request.app.state.metrics, scope)), media_type=CONTENT_TYPE_LATEST)
