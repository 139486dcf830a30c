"""A tenant fetches what its job wrote (`sluice job files`, `sluice job download`), on the real
local engine with tenant isolation: the model in its HOME and its checkpoint come back byte for
byte; what the job planted to reach further — a link to the plane's admin token, a link to
/etc, a FIFO — comes back as nothing, and another tenant sees none of it."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from sluice.api.app import create_app
from sluice.cli.main import app as cli
from sluice.control.plane import ControlPlane
from sluice.model import Phase
from sluice.settings import Settings
from sluice.spec import TenantSpec, parse_job_spec

from ..live_api import serve_for_cli
from .conftest import wait_for

pytestmark = pytest.mark.integration

WRITER = """
import os, sys
home = os.environ["HOME"]
with open(os.path.join(home, "model.bin"), "wb") as f:
    f.write(bytes(range(256)) * 6000)
os.makedirs(os.path.join(home, "out"), exist_ok=True)
open(os.path.join(home, "out", "metrics.json"), "w").write('{"acc": 0.9}')
ckpt = os.environ["SLUICE_CHECKPOINT_DIR"]
os.makedirs(ckpt, exist_ok=True)
open(os.path.join(ckpt, "ckpt-7.pt"), "wb").write(b"weights")
os.symlink(sys.argv[1], os.path.join(home, "token"))
os.symlink("/etc", os.path.join(home, "etc"))
os.mkfifo(os.path.join(home, "pipe"))
"""


@pytest.fixture
def plane(sluice_settings: Settings) -> Iterator[ControlPlane]:
    settings = sluice_settings.model_copy(update={"reconcile_interval_s": 0.1, "policy": "kube"})
    p = ControlPlane.from_settings(settings)
    if not p.isolation.enabled:
        p.stop()
        pytest.skip(f"needs tenant isolation: {p.isolation.reason}")
    p.tokens = p.bootstrap_tenants()  # type: ignore[attr-defined]
    p.start()
    yield p
    p.stop()


def test_a_tenant_fetches_its_jobs_model_and_checkpoint_and_nothing_beyond(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    p = plane
    admin = p.store.get_tenant("admin")
    assert admin is not None
    _, alice_token = p.create_tenant(admin, TenantSpec(name="alice"))
    _, bob_token = p.create_tenant(admin, TenantSpec(name="bob"))
    alice = p.store.get_tenant("alice")
    assert alice is not None
    token_path = str(p.settings.home / "admin.token")
    spec = parse_job_spec({"name": "w", "command": ["python", "-c", WRITER, token_path], "resources": {"cpu": 0.5}})
    job = p.submit(alice, spec)
    assert wait_for(lambda: p.controller.book.get(job.id).phase.terminal, 60)  # type: ignore[union-attr]
    done = p.controller.book.get(job.id)
    assert done is not None and done.phase == Phase.SUCCEEDED, done.reason
    model = bytes(range(256)) * 6000

    with TestClient(create_app(p)) as http:

        def call(token: str, url: str, **params: object):  # type: ignore[no-untyped-def]
            return http.get(url, params=params, headers={"Authorization": f"Bearer {token}"})

        top = call(alice_token, f"/v1/jobs/{job.id}/files").json()
        assert {e["name"] for e in top["entries"]} == {"work", "tmp", "checkpoints"}, top
        work = call(alice_token, f"/v1/jobs/{job.id}/files", path="work").json()
        assert sorted((e["name"], e["kind"], e["size"]) for e in work["entries"]) == [
            ("model.bin", "file", len(model)),
            ("out", "folder", 0),
        ]
        got = call(alice_token, f"/v1/jobs/{job.id}/files/content", path="work/model.bin")
        assert got.status_code == 200 and got.content == model
        assert call(alice_token, f"/v1/jobs/{job.id}/files/content", path="checkpoints/ckpt-7.pt").content == b"weights"
        for hostile in ("work/token", "work/etc/passwd", "work/pipe", "job.log", "attempt-1/state.json"):
            r = call(alice_token, f"/v1/jobs/{job.id}/files/content", path=hostile)
            assert r.status_code == 404 and b"plane" not in r.content, (hostile, r.text)
        r = call(alice_token, f"/v1/jobs/{job.id}/files/content", path="../../admin.token")
        assert r.status_code == 422 and r.json()["problems"][0]["field"] == "path"
        # another tenant: the job is not there at all
        assert call(bob_token, f"/v1/jobs/{job.id}/files").status_code == 404
        assert call(bob_token, f"/v1/jobs/{job.id}/files/content", path="work/model.bin").status_code == 404

    runner = CliRunner()
    with serve_for_cli(p, p.settings.home, p.tokens, monkeypatch):  # type: ignore[attr-defined]
        monkeypatch.setenv("SLUICE_TOKEN", alice_token)  # (serving clears it)
        r = runner.invoke(cli, ["job", "files", job.id, "work"])
        assert r.exit_code == 0 and "model.bin" in r.output and "out/" in r.output, r.output
        assert "token" not in r.output
        dest = tmp_path / "model.bin"
        r = runner.invoke(cli, ["job", "download", job.id, "work/model.bin", "--to", str(dest)])
        assert r.exit_code == 0, r.output
        assert hashlib.sha256(dest.read_bytes()).digest() == hashlib.sha256(model).digest()
        r = runner.invoke(cli, ["job", "download", job.id, "work/model.bin", "--to", str(dest)])
        assert r.exit_code == 2 and "exists" in r.output
        r = runner.invoke(cli, ["job", "download", job.id, "work/token", "--to", str(tmp_path / "t")])
        assert r.exit_code == 1 and not (tmp_path / "t").exists() and not (tmp_path / "t.part").exists()

    # a deleted tenant's files are not served, and reading them gives it no new uid
    p.delete_tenant(admin, "alice")
    with TestClient(create_app(p)) as http:
        r = http.get(f"/v1/jobs/{job.id}/files", headers={"Authorization": f"Bearer {p.tokens['admin']}"})  # type: ignore[attr-defined]
        assert r.status_code == 404 and "was deleted" in r.json()["detail"], r.text
    with p.store._engine.begin() as conn:  # type: ignore[attr-defined]
        live_uids = conn.exec_driver_sql(
            "SELECT uid FROM tenant_uids WHERE tenant = 'alice' AND released_at IS NULL"
        ).all()
    assert live_uids == []
