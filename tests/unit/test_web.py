"""The dashboard's HTTP side (sluice.web): `/` leads to it, every /ui path serves the same
data-free shell under a strict CSP, and every asset it loads is served by sluice itself (it
works offline). What the pages show is tested in a real browser (tests/browser)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from sluice import web
from sluice.api.app import create_app
from sluice.control.plane import ControlPlane
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.store.sql import SqlStore

from .fake_engine import FakeEngine

URL_ATTR = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(home=tmp_path / "home")
    plane = ControlPlane(settings, SqlStore(settings.db_url), FakeEngine(), make_policy("kube"))
    with TestClient(create_app(plane)) as c:
        yield c
    plane.store.close()


def test_root_redirects_to_the_dashboard(client: TestClient) -> None:
    r = client.get("/", follow_redirects=False)
    assert r.status_code in (302, 307) and r.headers["location"] == "/ui/"
    assert client.get("/").status_code == 200


@pytest.mark.parametrize("path", ["/ui", "/ui/", "/ui/jobs", "/ui/jobs/j-123", "/ui/nodes", "/ui/anything/else"])
def test_every_dashboard_path_serves_the_same_shell_with_a_strict_csp(client: TestClient, path: str) -> None:
    """No token is needed for the shell because it holds no data: app.js fetches that from
    the API with the tenant's token."""
    r = client.get(path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.text == (web.STATIC / "index.html").read_text()
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp
    assert "unsafe-eval" not in csp and "script-src 'self' 'unsafe-inline'" not in csp


def test_the_shell_loads_only_local_assets_and_each_is_served(client: TestClient) -> None:
    html = client.get("/ui/").text
    urls = [u for u in URL_ATTR.findall(html) if u.startswith("/ui/static/")]
    assert any(u.endswith("uPlot.iife.min.js") for u in urls) and any(u.endswith("app.js") for u in urls)
    for url in urls:
        r = client.get(url)
        assert r.status_code == 200 and r.content, url


def test_no_asset_reaches_another_host() -> None:
    """Offline: no CDN, font or analytics URL in the dashboard's own files (uPlot's bundle is
    checked for loads, not for the URLs in its comments)."""
    for name in ("index.html", "app.js", "style.css"):
        text = (web.STATIC / name).read_text()
        assert not re.search(r"https?://", text), name
    bundle = (web.STATIC / "vendor" / "uPlot.iife.min.js").read_text()
    assert "import(" not in bundle and "fetch(" not in bundle
    assert (web.STATIC / "vendor" / "uPlot.LICENSE").read_text().startswith("The MIT License")


def test_app_js_never_inserts_api_data_as_html() -> None:
    """Job names, reasons and logs are other people's strings: they go in as text."""
    js = (web.STATIC / "app.js").read_text()
    assert "innerHTML" not in js and "outerHTML" not in js and "insertAdjacentHTML" not in js
    assert "document.write" not in js and "eval(" not in js
