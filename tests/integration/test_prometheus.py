"""A real Prometheus scrapes a live sluice server: the job a real process runs (reporting
through the SDK) comes back through Prometheus's own query API, scraped with the metrics token
the way deploy/prometheus/prometheus.yml does it (docs/metrics.md)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluice.control.plane import ControlPlane
from sluice.settings import Settings
from sluice.spec import parse_job_spec

from ..live_api import free_port, serve_for_cli
from .conftest import JOBS, wait_for

pytestmark = pytest.mark.integration

PROMETHEUS = shutil.which("prometheus")
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "sluice.json"
TOKEN = "metrics-token-for-the-test"
WAIT_S = 40.0
"""Ceiling for the first useful scrape (a guard against hanging, not a speed assertion)."""

CONFIG = """\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: sluice
    metrics_path: /metrics
    authorization:
      type: Bearer
      credentials_file: {token_file}
    static_configs:
      - targets: ["{target}"]
"""


@pytest.fixture
def plane(sluice_settings: Settings) -> Iterator[ControlPlane]:
    settings = sluice_settings.model_copy(update={"reconcile_interval_s": 0.1, "metrics_token": TOKEN})
    p = ControlPlane.from_settings(settings)
    p.tokens = p.bootstrap_tenants()  # type: ignore[attr-defined]
    p.start()
    yield p
    admin = p.store.get_tenant("admin")
    assert admin is not None
    for j in p.list_jobs(admin):
        if not j.phase.terminal:
            p.cancel(admin, j.id)
    wait_for(lambda: all(j.phase.terminal for j in p.list_jobs(admin)), 20)
    p.stop()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Any]:
    """Start Prometheus on a free loopback port with a config for `target`; killed at the end."""
    if PROMETHEUS is None:
        pytest.skip("the prometheus binary is not installed (scripts/setup.sh installs Debian's prometheus)")
    procs: list[subprocess.Popen[bytes]] = []

    def start(target: str) -> str:
        (tmp_path / "token").write_text(TOKEN)
        config = tmp_path / "prometheus.yml"
        config.write_text(CONFIG.format(token_file=tmp_path / "token", target=target))
        port = free_port()
        proc = subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "prometheus.log").open("wb"),
        )
        procs.append(proc)
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


def query(prom: str, expr: str) -> list[dict[str, Any]]:
    try:
        r = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=5)
    except httpx.TransportError:  # not listening yet
        return []
    if r.status_code != 200:
        return []
    out: list[dict[str, Any]] = r.json()["data"]["result"]
    return out


def test_prometheus_scrapes_a_running_jobs_series(
    plane: ControlPlane, prometheus: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = plane.settings.home
    with serve_for_cli(plane, home, plane.tokens, monkeypatch) as url:  # type: ignore[attr-defined]
        default = plane.authenticate(plane.tokens["default"])  # type: ignore[attr-defined]
        spec = parse_job_spec(
            {
                "command": ["python", str(JOBS / "sdk_loop.py"), "--sleep", "0.05"],
                "workdir": str(JOBS),
                "resources": {"cpu": {"min": 0.25, "max": 0.25}},
            }
        )
        job = plane.submit(default, spec)
        prom = prometheus(url.removeprefix("http://"))

        def scraped_steps() -> bool:
            rows = query(prom, f'sluice_job_step{{job_id="{job.id}"}}')
            return bool(rows) and float(rows[0]["value"][1]) > 0

        log = tmp_path / "prometheus.log"
        assert wait_for(scraped_steps, WAIT_S, every=0.5), log.read_text()[-2000:]
        rows = query(prom, f'sluice_job_step{{job_id="{job.id}"}}')
        labels = rows[0]["metric"]
        assert labels["tenant"] == "default" and labels["queue"] == "default" and labels["job"] == "sluice"
        up = query(prom, 'up{job="sluice"}')
        assert up and up[0]["value"][1] == "1"
        assert query(prom, 'sluice_node_health{state="Healthy"} == 1')
        dashboard_queries_are_valid(prom, url)


def dashboard_queries_are_valid(prom: str, url: str) -> None:
    """Every query of deploy/grafana/sluice.json parses in this Prometheus, and every sluice
    series it names is one the server exports."""
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exported = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).text
    # Families are declared (# TYPE) even while they have no sample; the anomaly ones only
    # where the health monitor runs (off here: it would spend the test's CPU training).
    bare = re.compile(r"_(total|bucket|count|sum)$")
    names = {bare.sub("", n) for n in re.findall(r"^# TYPE (sluice_[a-z_]+)", exported, re.M)}
    names |= {"sluice_node_anomaly_score", "sluice_node_anomaly_threshold"}
    for expr in exprs:
        expr = expr.replace("$tenant", ".*").replace("$queue", ".*")
        r = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=5)
        assert r.status_code == 200 and r.json()["status"] == "success", (expr, r.text)
        for name in re.findall(r"\bsluice_[a-z_]+", expr):
            name = bare.sub("", name)
            assert name in names, f"the dashboard uses {name}, which /metrics does not export"
