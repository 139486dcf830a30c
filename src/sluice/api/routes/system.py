"""Unauthenticated operational routes: liveness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter(tags=["system"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """200 while the API process serves requests (what `sluice up` waits for)."""
    return {"status": "ok"}


@router.get("/metrics", response_class=Response)
def metrics(request: Request) -> Response:
    """Prometheus text format: sluice_jobs{phase}, sluice_reconcile_round_seconds, ..."""
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
