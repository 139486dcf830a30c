"""`sluice dataset create|list|get|warm|rm` end to end: the CLI against a live API server on
loopback (real FastAPI app, real ControlPlane over SqlStore), datasets served by a real HTTP
server, warmed into a real node cache. The engine is tests/unit/fake_engine.py's FakeEngine —
a fake, because no job runs here; datasets are the subject."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sluice.cli.main import app
from sluice.control.datasets import DatasetService, generation
from sluice.control.plane import ControlPlane
from sluice.data.httpserve import DataServer
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.spec import TenantSpec
from sluice.store.sql import SqlStore

from ..live_api import serve_for_cli
from ..unit.fake_engine import FakeEngine

pytestmark = pytest.mark.integration
runner = CliRunner()


@pytest.fixture
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ControlPlane, Path, dict[str, str]]]:
    home = tmp_path / "home"
    home.mkdir()
    mem = f"/dev/shm/sluice-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("SLUICE_CACHE_DISK_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SLUICE_CACHE_MEMORY_DIR", mem)
    monkeypatch.setenv("SLUICE_CACHE_MEMORY_BYTES", str(64 << 20))
    # The admin's allow-list lets the plane fetch from the test's loopback server and read
    # local folders under tmp_path (tests/security shows both are refused without it).
    settings = Settings(home=home, allow_source_hosts=["127.0.0.1"], dataset_roots=[str(tmp_path)])
    plane = ControlPlane(settings, SqlStore(settings.db_url), FakeEngine(), make_policy("data-aware"))
    tokens = plane.bootstrap_tenants()
    _, tokens["bob"] = plane.create_tenant(plane.authenticate(tokens["admin"]), TenantSpec(name="bob"))
    try:
        with serve_for_cli(plane, home, tokens, monkeypatch):
            yield plane, tmp_path, tokens
    finally:
        plane.store.close()
        shutil.rmtree(mem, ignore_errors=True)


def sluice(*args: str) -> tuple[int, str, str]:
    r = runner.invoke(app, list(args))
    if r.exception and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.stdout, r.stderr


def test_dataset_lifecycle_through_the_cli(live, monkeypatch: pytest.MonkeyPatch) -> None:
    plane, tmp, tokens = live
    src = tmp / "imgs"
    for i in range(40):
        (src / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"c{i % 2}" / f"{i:03d}.jpg").write_bytes(bytes([i]) * (1000 + i))
    with DataServer(src) as srv:
        bad = tmp / "bad.yaml"
        bad.write_text("name: imgs\nsource: ftp://x/y\n")
        code, _, err = sluice("dataset", "create", str(bad))
        assert code == 2 and "source" in err and "ftp" in err
        bad.write_text(f"name: imgs\nsource: {tmp / 'nowhere'}\n")
        code, _, err = sluice("dataset", "create", str(bad))
        assert code == 2 and "source" in err
        good = tmp / "imgs.yaml"
        good.write_text(f"name: imgs\nsource: {srv.url}\n")
        code, out, err = sluice("dataset", "create", str(good))
        assert code == 0, err
        assert "40 files" in out
        code, out, _ = sluice("dataset", "create", str(good))
        assert code == 1
        code, out, _ = sluice("dataset", "list", "-o", "json")
        [d] = json.loads(out)
        assert d["name"] == "imgs" and d["items"] == 40 and d["cached_fraction"] == 0.0
        code, out, err = sluice("dataset", "warm", "imgs")
        assert code == 0, err
        assert "100% cached" in out and "fetched 40 files" in out
        code, out, err = sluice("dataset", "warm", "imgs", "-o", "json")
        assert code == 0, err
        [again] = json.loads(out)["nodes"]  # the fake engine has no agents: the plane's node
        assert again["files_fetched"] == 0 and again["already_cached"] == 40 and again["error"] is None
        code, _, err = sluice("dataset", "warm", "imgs", "--node", "elsewhere")
        assert code == 2 and "nodes" in err
        code, out, _ = sluice("dataset", "get", "imgs", "-o", "json")
        assert json.loads(out)["cached_fraction"] == 1.0
        monkeypatch.setenv("SLUICE_TOKEN", tokens["bob"])  # another tenant sees nothing
        code, out, _ = sluice("dataset", "list", "-o", "json")
        assert json.loads(out) == []
        code, _, err = sluice("dataset", "get", "imgs")
        assert code == 1 and "no dataset" in err
        monkeypatch.delenv("SLUICE_TOKEN")
        svc = DatasetService(plane.store)
        env = svc.launch_env("default", ["imgs"])
        rec = plane.store.get_dataset("default", "imgs")
        assert rec is not None
        assert json.loads(env["SLUICE_DATASETS"]) == {
            "imgs": {
                "source": srv.url,
                "storage_options": {},
                "cache_key": "default/imgs",
                "generation": generation(rec),
            }
        }
        assert svc.dataset_bytes("default", ["imgs"]) == {"default/imgs": sum(1000 + i for i in range(40))}
        code, _, err = sluice("dataset", "rm", "imgs")
        assert code == 0, err
        assert sluice("dataset", "list", "-o", "json")[1].strip() == "[]"
        assert svc.node_cache().state()[0] == {}
        # ... and no copy is left anywhere: the shared cache, nor the tenant uid's own (isolation)
        cs = plane.datasets.cache_settings
        for base in (Path(cs.resolved_disk_dir()), Path(cs.resolved_memory_dir())):
            assert not [*base.glob("default~imgs-*"), *base.glob("uid-*/default~imgs-*")], base
