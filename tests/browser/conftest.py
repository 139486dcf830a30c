"""A real sluice (control plane, local engine, real job processes, the API on a loopback
port) and a real headless Chromium driven by Selenium, for the dashboard's tests.

The browser is Debian's `chromium` with its matching `chromium-driver` (scripts/setup.sh
installs both); Selenium is pointed at them so its Selenium Manager never downloads a
browser or driver. Without them the tests skip, saying so.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluice.control.plane import ControlPlane
from sluice.model import NodeHealth
from sluice.spec import TenantSpec
from tests.conftest import passable
from tests.integration.conftest import JOBS, clean_up, plane_settings, wait_for

from ..live_api import serve_for_cli

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


def _binary(preferred: Path, name: str) -> str | None:
    return str(preferred) if preferred.is_file() else shutil.which(name)


@dataclass
class Live:
    """A served plane: its URL and each tenant's token (admin, default, alice, bob). alice and
    bob are this test's own tenants (`names` says what they are called): the plane is shared by
    the module's tests, their tenants are not."""

    plane: ControlPlane
    url: str
    tokens: dict[str, str]
    names: dict[str, str]

    def api(self, tenant: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.tokens[tenant]}"}, timeout=30)

    def submit(self, tenant: str, name: str, **extra: Any) -> dict[str, Any]:
        """A job that reports a falling loss through the SDK every 0.05 s until stopped."""
        spec = {
            "name": name,
            "command": ["python", str(JOBS / "sdk_loop.py"), "--sleep", "0.05"],
            "workdir": str(JOBS),
            "resources": {"cpu": {"min": 0.25, "max": 0.25}},
            "checkpoint": {"interval_s": 1.0},
            **extra,
        }
        with self.api(tenant) as c:
            r = c.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        out: dict[str, Any] = r.json()
        return out

    def job(self, tenant: str, job_id: str) -> dict[str, Any]:
        with self.api(tenant) as c:
            r = c.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out


@dataclass
class Served:
    plane: ControlPlane
    url: str
    tokens: dict[str, str]
    """admin's and default's."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One plane and API server for the module's tests (each started its own: ~2 s of start and
    stop apiece). Each test gets tenants of its own (`live`), so what one test submits, creates
    or sees is never another's; `live` cancels a test's jobs and uncordons the nodes after it."""
    folder = tmp_path_factory.mktemp("dashboard")
    if os.geteuid() == 0:  # jobs run as tenant uids: they pass through to their folders (tests/conftest.py)
        passable(folder.parent, tmp_path_factory.getbasetemp().parent)
        folder.chmod(0o1777)
    settings = plane_settings(folder).model_copy(update={"reconcile_interval_s": 0.1, "policy": "kube"})
    with pytest.MonkeyPatch.context() as monkeypatch:
        # The nodes' memory cache tier would default to a folder in /dev/shm that outlives the test.
        monkeypatch.setenv("SLUICE_CACHE_MEMORY_DIR", str(folder / "memory-cache"))
        try:
            plane = ControlPlane.from_settings(settings)
            tokens = plane.bootstrap_tenants()
            plane.start()
            try:
                with serve_for_cli(plane, settings.home, tokens, monkeypatch) as url:
                    yield Served(plane, url, tokens)
            finally:
                plane.stop()
        finally:
            clean_up(settings)


_tenants = itertools.count()


@pytest.fixture
def live(served: Served) -> Iterator[Live]:
    plane = served.plane
    admin = plane.authenticate(served.tokens["admin"])
    tokens, names = dict(served.tokens), {}
    n = next(_tenants)
    for role in ("alice", "bob"):
        names[role] = f"{role}-{n}"
        _, tokens[role] = plane.create_tenant(admin, TenantSpec(name=names[role]))
    try:
        yield Live(plane, served.url, tokens, names)
    finally:
        for j in plane.list_jobs(admin):
            if not j.phase.terminal:
                plane.cancel(admin, j.id)
        for node in plane.store.list_nodes():
            if node.health == NodeHealth.CORDONED:
                plane.uncordon(admin, node.name)
        assert wait_for(lambda: all(j.phase.terminal for j in plane.list_jobs(admin)), 20), "jobs left running"


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One headless Chromium for the session (a fresh profile under pytest's tmp folder)."""
    chromium, driver_bin = _binary(CHROMIUM, "chromium"), _binary(CHROMEDRIVER, "chromedriver")
    if chromium is None or driver_bin is None:
        pytest.skip("no chromium/chromedriver binary: apt-get install chromium chromium-driver (scripts/setup.sh)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the dev extra)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "SEVERE"})  # page errors, read by the tests
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=driver_bin))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page(browser: Any, live: Live) -> Iterator[Any]:
    """The browser with a clean session for this test's server."""
    yield browser
    browser.execute_script("sessionStorage.clear()")
