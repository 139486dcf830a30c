"""The FastAPI application: `create_app(plane)` serves a ControlPlane over HTTP.

Everything here is translation — HTTP in, control-plane call, JSON out. Authorization and
every decision live in the control plane, so the CLI, the web UI and tests see one behaviour.
"""

from __future__ import annotations

from fastapi import FastAPI

import sluice
from sluice.api import errors, routes_datasets
from sluice.api.contract import Plane
from sluice.api.limits import BodyLimit
from sluice.api.metrics import build_registry
from sluice.api.routes import jobs, nodes, system, tenants

DEFAULT_MAX_BODY_BYTES = 1024 * 1024


def create_app(plane: Plane, *, max_body_bytes: int | None = None) -> FastAPI:
    """An app over `plane`. Request bodies above `max_body_bytes` (default: the plane's
    settings.max_body_bytes, else 1 MiB) are answered 413 before parsing."""
    if max_body_bytes is None:
        settings = getattr(plane, "settings", None)
        max_body_bytes = int(getattr(settings, "max_body_bytes", DEFAULT_MAX_BODY_BYTES))
    app = FastAPI(
        title="sluice",
        version=getattr(sluice, "__version__", "0"),
        description="Submit, watch and explain training jobs; manage nodes and tenants. "
        "Authenticate with `Authorization: Bearer <token>`.",
        docs_url="/docs",
        openapi_url="/openapi.json",
    )
    app.state.plane = plane
    app.state.registry = build_registry(plane)
    errors.install(app)
    for module in (system, jobs, nodes, tenants):
        app.include_router(module.router)
    app.include_router(routes_datasets.router)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    return app
