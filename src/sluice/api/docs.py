"""The interactive API docs (/docs: Swagger UI, /redoc: ReDoc) served from files installed
with sluice instead of a CDN.

Why: FastAPI's default pages load their JavaScript and CSS from cdn.jsdelivr.net, so on a
cluster without internet access (common for GPU clusters) /docs is a blank page. The assets
come from the `fastapi-offline` package (a dependency; only its static files are used), and
are mounted under ASSETS_URL next to the API.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_URL = "/docs-assets"
"""Where the Swagger UI and ReDoc files are served."""

ASSET_PACKAGE = "fastapi-offline"
ASSET_FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")


def assets_dir() -> Path | None:
    """The folder holding ASSET_FILES, from the installed fastapi-offline package; None when
    it is not installed (an environment made before it became a dependency)."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "static"
    return folder if all((folder / f).is_file() for f in ASSET_FILES) else None


def _missing() -> HTMLResponse:
    """Said instead of a blank page when the assets are not installed: the API itself works."""
    return HTMLResponse(
        f"<!doctype html><title>sluice API docs</title><p>The API docs' files are not installed: "
        f"<code>pip install {ASSET_PACKAGE}</code> (a sluice dependency), or read <a href='openapi.json'>"
        "openapi.json</a>.</p>",
        status_code=503,
    )


def install(app: FastAPI) -> None:
    """Add /docs and /redoc to an app made with docs_url=None and redoc_url=None. Every URL the
    pages reference is on this server, under the request's root_path (behind a proxy)."""
    folder = assets_dir()
    if folder is not None:
        app.mount(ASSETS_URL, StaticFiles(directory=folder), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"
    title = f"{app.title} API"

    @app.get("/docs", include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        if folder is None:
            return _missing()
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=title,
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        if folder is None:
            return _missing()
        root = request.scope.get("root_path", "").rstrip("/")
        return get_redoc_html(
            openapi_url=root + openapi_url,
            title=title,
            redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )
