"""The FastAPI application: `create_app(plane)` serves a ControlPlane over HTTP.

Everything here is translation — HTTP in, control-plane call, JSON out. Authorization and
every decision live in the control plane, so the CLI and tests see one behaviour.
"""

from __future__ import annotations

from fastapi import FastAPI

import sluice
from sluice.api import docs, errors, routes_datasets
from sluice.api.limits import BodyLimit, WritesHalted
from sluice.api.metrics import build_metrics
from sluice.api.routes import cluster, job_files, jobs, nodes, priority_classes, queues, system, tenants, usage
from sluice.control.plane import ControlPlane
from sluice.web import install as install_dashboard


def create_app(plane: ControlPlane, *, max_body_bytes: int | None = None) -> FastAPI:
    """An app over `plane`. Request bodies above `max_body_bytes` (default: the plane's
    settings.max_body_bytes) are answered 413 before parsing."""
    if max_body_bytes is None:
        max_body_bytes = plane.settings.max_body_bytes
    app = FastAPI(
        title="sluice",
        version=getattr(sluice, "__version__", "0"),
        description="Submit, watch and explain training jobs; manage nodes and tenants. "
        "Authenticate with `Authorization: Bearer <token>`.",
        openapi_url="/openapi.json",
        docs_url=None,  # served from local files instead of a CDN: sluice.api.docs
        redoc_url=None,
    )
    app.state.plane = plane
    app.state.metrics = build_metrics(plane)
    errors.install(app)
    for module in (system, jobs, job_files, nodes, cluster, tenants, queues, priority_classes, usage):
        app.include_router(module.router)
    app.include_router(routes_datasets.router)
    docs.install(app)
    install_dashboard(app)  # the web dashboard at /ui (/ redirects there): static files over this API
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(WritesHalted, halted=lambda: plane.lost_database)
    return app
