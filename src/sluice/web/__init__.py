"""The web dashboard: a static page shell plus JavaScript that calls the JSON API (/v1/...).

Why static files and no server-side rendering: the browser sends the tenant's token as the
API's bearer token on every call, so the dashboard sees exactly what that tenant may see
through the same authorization as the CLI, and this module never touches the control plane.
Every asset (the uPlot charting library included) ships in `static/`, so the dashboard works
on a cluster without internet access.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent / "static"
"""The dashboard's files: index.html (the shell every page shares), app.js, style.css, vendor/."""

PREFIX = "/ui"
"""Where the dashboard lives; `/` redirects here."""

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
"""Only this server's own scripts run (job names and log lines are shown as text, and a CSP
without inline scripts keeps a slip there from becoming script). Inline styles stay allowed:
uPlot sizes its canvas through style attributes."""

_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}


def _shell() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html", headers=_HEADERS)


def install(app: FastAPI) -> None:
    """Serve the dashboard under PREFIX: static files under PREFIX/static, the page shell for
    every other path under PREFIX (app.js routes on location.pathname), `/` redirecting to it."""
    app.mount(f"{PREFIX}/static", StaticFiles(directory=STATIC), name="web-static")

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse(f"{PREFIX}/")

    @app.get(PREFIX, include_in_schema=False)
    @app.get(PREFIX + "/{page:path}", include_in_schema=False)
    def shell(page: str = "") -> FileResponse:
        return _shell()
