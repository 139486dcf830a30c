"""/v1/cluster/stats: small, bounded summaries of the whole cluster for the dashboard's overview.

Why an endpoint and not the page scraping /metrics: the histogram there has fixed buckets and
no history, while the overview wants recent quantiles and a timeline now. Both come from the
metrics round observer's bounded buffers, so the figures match what /metrics is built from.
The figures are cluster-wide (round times, cores), as /metrics serves them without a token:
they name no tenant, job, queue or dataset.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from sluice.api.auth import CallerDep
from sluice.api.schemas import ErrorOut

router = APIRouter(prefix="/v1/cluster", tags=["cluster"])


@router.get("/stats", responses={401: {"model": ErrorOut}})
def cluster_stats(request: Request, caller: CallerDep) -> dict[str, Any]:
    """Reconcile round latency over the last 200 rounds (count, p50, p95, max, in seconds) and
    the allocation timeline: `[time, cores requested by active jobs, cluster cores]`, one
    sample every 2 s at most, the last 300 (ten minutes), oldest first."""
    metrics = request.app.state.metrics
    return {"rounds": metrics.round_summary(), "allocation": [list(x) for x in metrics.allocation_history()]}
