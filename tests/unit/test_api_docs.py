"""/docs and /redoc work without internet: every script, stylesheet and icon the pages load is
served by the API itself (no CDN), and each of them answers 200."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from sluice.api import docs
from sluice.api.app import create_app
from sluice.control.plane import ControlPlane
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.store.sql import SqlStore

from .fake_engine import FakeEngine

URL_ATTR = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")


def _plane(tmp_path: Path) -> ControlPlane:
    settings = Settings(home=tmp_path / "home")
    return ControlPlane(settings, SqlStore(settings.db_url), FakeEngine(), make_policy("kube"))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    plane = _plane(tmp_path)
    with TestClient(create_app(plane)) as c:
        yield c
    plane.store.close()


def referenced(html: str) -> list[str]:
    """Every URL a page's tags load or link to."""
    return URL_ATTR.findall(html)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_only_local_assets(client: TestClient, page: str) -> None:
    r = client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    urls = referenced(r.text)
    assert any(u.endswith(".js") for u in urls), urls
    assert not re.search(r"https?://", r.text), "a page references another host (a CDN?)"
    for url in urls:
        assert url.startswith("/"), url
        got = client.get(url)
        assert got.status_code == 200, url
        assert got.content, url
    assert "/openapi.json" in r.text and client.get("/openapi.json").status_code == 200


def test_swagger_page_uses_the_shipped_bundle_and_css(client: TestClient) -> None:
    urls = referenced(client.get("/docs").text)
    assert f"{docs.ASSETS_URL}/swagger-ui-bundle.js" in urls and f"{docs.ASSETS_URL}/swagger-ui.css" in urls
    assert "/docs" not in client.get("/openapi.json").json()["paths"]


def test_without_the_assets_docs_says_what_to_install_and_the_api_still_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(docs, "assets_dir", lambda: None)
    plane = _plane(tmp_path)
    with TestClient(create_app(plane)) as c:
        r = c.get("/docs")
        assert r.status_code == 503 and docs.ASSET_PACKAGE in r.text
        assert c.get("/healthz").json() == {"status": "ok"}
    plane.store.close()
