"""Issue 10, part 3: an ordinary tenant tries to make the control plane write or read outside
what is its own, through the API, and every attempt is a 4xx naming the field.

- checkpoint.location: system folders, `..`, symlinks out of an admin root, URLs outside roots;
- dataset sources: local paths outside the admin's dataset roots (and symlinks out of them),
  loopback / link-local / private / unspecified hosts in every spelling, the same reached by
  DNS or through a redirect, proxies and S3 endpoints smuggled in storage options.
The loopback servers are real (started here); the allow-list tests show the same sources are
fetched once the admin allows them, so each refusal is the guard's doing, not a dead server.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from aiohttp import web

from sluice.data.guard import SourceGuard, SourceRefused
from sluice.data.httpserve import DataServer
from sluice.data.loopback import LoopbackServer
from sluice.data.source import Source

from .confine_helpers import live_plane, problem_fields

pytestmark = pytest.mark.integration


def job(location: str) -> dict[str, object]:
    return {"command": ["python", "train.py"], "checkpoint": {"location": location}}


def dataset(name: str, source: str, **opts: str) -> dict[str, object]:
    return {"name": name, "source": source, "storage_options": opts}


@pytest.fixture
def data(tmp_path: Path) -> Path:
    src = tmp_path / "data" / "imgs"
    src.mkdir(parents=True)
    for i in range(5):
        (src / f"{i}.bin").write_bytes(bytes([i]) * 100)
    return src


# -- checkpoint.location -------------------------------------------------------------------


@pytest.mark.parametrize(
    "location",
    [
        "/etc",
        "/etc/cron.d",
        "file:///etc",
        "../../somewhere",
        "ckpt/../../../x",
        "..",
        "/tmp/../etc",
        "s3://any-bucket/ckpt",
        "memory://ckpt",
        "simplecache::file:///etc",
        # the run folder itself and the plane's names in it: the folder is handed to the job's uid
        ".",
        "./",
        "attempt-1",
        "attempt-7/x",
        "a/../attempt-1",
        "job.log",
        "work/ckpt",
    ],
)
def test_checkpoint_location_outside_run_folder_and_roots_is_a_422(tmp_path, monkeypatch, location) -> None:
    roots = [str(tmp_path / "ckroot")]
    with live_plane(tmp_path, monkeypatch, checkpoint_roots=roots) as api:
        r = api.call("alice", "POST", "/v1/jobs", json=job(location))
        assert r.status_code == 422, r.text
        assert problem_fields(r) == ["checkpoint.location"]
        assert api.plane.store.list_jobs() == []


def test_checkpoint_symlink_out_of_an_admin_root_is_refused(tmp_path, monkeypatch) -> None:
    root = tmp_path / "ckroot"
    root.mkdir()
    (root / "escape").symlink_to("/etc")
    with live_plane(tmp_path, monkeypatch, checkpoint_roots=[str(root)]) as api:
        r = api.call("alice", "POST", "/v1/jobs", json=job(str(root / "escape" / "x")))
        assert r.status_code == 422 and problem_fields(r) == ["checkpoint.location"]
        assert "/etc/x" in r.text  # the message says where it really leads


def test_allowed_checkpoint_locations_are_kept_canonical(tmp_path, monkeypatch) -> None:
    real = tmp_path / "real-root"
    real.mkdir()
    alias = tmp_path / "alias"
    alias.symlink_to(real)
    with live_plane(tmp_path, monkeypatch, checkpoint_roots=[str(alias), "s3://ckpt-bucket/jobs"]) as api:
        r = api.call("alice", "POST", "/v1/jobs", json=job(str(alias / "team")))
        assert r.status_code == 201, r.text
        rec = api.plane.store.get_job(r.json()["id"])
        # stored resolved: a symlink swapped in later cannot redirect the folder
        assert rec.spec.checkpoint.location == str(real / "team")
        assert api.plane.controller.checkpoint_dir(rec) == f"{real / 'team'}/{rec.id}/checkpoints"
        r = api.call("alice", "POST", "/v1/jobs", json=job("ckpt/latest"))
        assert r.status_code == 201, r.text
        rec = api.plane.store.get_job(r.json()["id"])
        run_root = api.plane.controller.checkpoint_root
        assert api.plane.controller.checkpoint_dir(rec) == f"{run_root}/{rec.id}/ckpt/latest"
        r = api.call("alice", "POST", "/v1/jobs", json=job("s3://ckpt-bucket/jobs/alice"))
        assert r.status_code == 201, r.text
        r = api.call("alice", "POST", "/v1/jobs", json=job("s3://ckpt-bucket/other"))
        assert r.status_code == 422 and problem_fields(r) == ["checkpoint.location"]


# -- local dataset sources -------------------------------------------------------------------


def test_local_sources_outside_the_admin_roots_are_refused(tmp_path, monkeypatch, data) -> None:
    (data.parent / "escape").symlink_to("/etc")
    with live_plane(tmp_path, monkeypatch, dataset_roots=[str(data.parent)]) as api:
        for source in ("file:///etc/ssh", "/etc", str(tmp_path / "cache"), "../../etc", str(data.parent / "escape")):
            r = api.call("alice", "POST", "/v1/datasets", json=dataset("x", source))
            assert r.status_code == 422, (source, r.text)
            assert problem_fields(r) == ["source"], source
            # a relative path is refused before it is resolved anywhere (against the plane's folder, say)
            assert ("is relative" if source.startswith("..") else "dataset_roots") in r.text, r.text
        r = api.call("alice", "POST", "/v1/datasets", json=dataset("imgs", str(data)))
        assert r.status_code == 201, r.text
        assert r.json()["items"] == 5


def test_without_dataset_roots_no_local_source_is_accepted(tmp_path, monkeypatch, data) -> None:
    with live_plane(tmp_path, monkeypatch) as api:
        r = api.call("alice", "POST", "/v1/datasets", json=dataset("imgs", str(data)))
        assert r.status_code == 422 and problem_fields(r) == ["source"]
        assert "none are configured" in r.text


def test_memory_and_unknown_schemes_are_refused(tmp_path, monkeypatch) -> None:
    with live_plane(tmp_path, monkeypatch) as api:
        for source in ("memory://shared/x", "ftp://h/x", "simplecache::file:///etc"):
            r = api.call("alice", "POST", "/v1/datasets", json=dataset("x", source))
            assert r.status_code == 422 and problem_fields(r) == ["source"], (source, r.text)


# -- network sources ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "127.1",
        "2130706433",  # 127.0.0.1 as one decimal number: resolves to loopback
        "localhost",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "0.0.0.0",
        "169.254.169.254",  # the cloud metadata service
        "10.1.2.3",
        "192.168.0.1",
        "172.16.5.5",
        "[fe80::1]",
        "224.0.0.1",
        "100.64.0.1",
    ],
)
def test_http_sources_on_non_public_addresses_are_refused(tmp_path, monkeypatch, host) -> None:
    with live_plane(tmp_path, monkeypatch) as api:
        r = api.call("alice", "POST", "/v1/datasets", json=dataset("x", f"http://{host}:8080/data/"))
        assert r.status_code == 422, r.text
        assert problem_fields(r) == ["source"]
        assert "allow_source_hosts" in r.text


def test_a_loopback_server_is_refused_unless_allow_listed(tmp_path, monkeypatch, data) -> None:
    with DataServer(data) as srv:
        with live_plane(tmp_path, monkeypatch) as api:
            r = api.call("alice", "POST", "/v1/datasets", json=dataset("imgs", srv.url))
            assert r.status_code == 422 and problem_fields(r) == ["source"]
            assert sum(srv.requests.values()) == 0  # refused before any request was sent
        with live_plane(tmp_path, monkeypatch, allow_source_hosts=["127.0.0.0/8"]) as api:
            r = api.call("alice", "POST", "/v1/datasets", json=dataset("imgs", srv.url))
            assert r.status_code == 201, r.text
            assert r.json()["items"] == 5


def test_storage_options_cannot_smuggle_a_proxy_or_an_internal_endpoint(tmp_path, monkeypatch) -> None:
    with live_plane(tmp_path, monkeypatch) as api:
        r = api.call(
            "alice", "POST", "/v1/datasets", json=dataset("x", "http://example.com/d/", proxy="http://127.0.0.1:3128")
        )
        assert r.status_code == 422 and problem_fields(r) == ["storage_options.proxy"]
        r = api.call(
            "alice", "POST", "/v1/datasets", json=dataset("x", "s3://bucket/d", endpoint_url="http://127.0.0.1:9000")
        )
        assert r.status_code == 422 and problem_fields(r) == ["storage_options.endpoint_url"]
        r = api.call(
            "alice", "POST", "/v1/datasets", json=dataset("x", "s3://b/d", endpoint_url="http://169.254.169.254")
        )
        assert r.status_code == 422 and problem_fields(r) == ["storage_options.endpoint_url"]
        r = api.call("alice", "POST", "/v1/datasets", json=dataset("x", "s3://b/d", config_kwargs="{}"))
        assert r.status_code == 422 and problem_fields(r) == ["storage_options.config_kwargs"]


class Redirector(LoopbackServer):
    """Answers every GET with a 302 to `target` + the path: a source that looks harmless."""

    thread_name = "sluice-test-redirector"

    def __init__(self, target: str, host: str) -> None:
        super().__init__(host)
        self.target = target.rstrip("/")

    def routes(self, app: web.Application) -> None:
        async def redirect(request: web.Request) -> web.StreamResponse:
            raise web.HTTPFound(self.target + request.path)

        app.router.add_route("GET", "/{tail:.*}", redirect)

    def __enter__(self) -> Redirector:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.mark.parametrize("via", ["127.0.0.1", "localhost"])
def test_a_redirect_to_a_refused_address_is_refused_on_that_hop(tmp_path, monkeypatch, data, via) -> None:
    """The allow-listed 127.0.0.2 redirects to the victim on 127.0.0.1: by IP (caught on the
    redirect hop) or by name (caught by the resolver, at connect time)."""
    with DataServer(data) as victim, Redirector(f"http://{via}:{victim.port}", "127.0.0.2") as hop:
        url = f"{hop.url}/"
        # Control: unguarded, the redirect does reach the victim's files.
        assert len(Source(url, retries=0).list()) == 5
        got = sum(victim.requests.values())
        with live_plane(tmp_path, monkeypatch, allow_source_hosts=["127.0.0.2"]) as api:
            r = api.call("alice", "POST", "/v1/datasets", json=dataset("x", url))
            assert r.status_code == 422, r.text
            assert problem_fields(r) == ["source"]
            assert "127.0.0.1" in r.text or "localhost" in r.text
        assert sum(victim.requests.values()) == got  # the victim saw no request from the plane


def test_an_allowed_host_and_port_does_not_open_the_hosts_other_ports(tmp_path, monkeypatch, data) -> None:
    """With `allow_source_hosts: ["127.0.0.2:PORT"]` the source on that port is fetched, and
    another service on the same host (a source naming it, or a redirect to it) is refused
    before any request reaches it. Before ports could be named, allowing a host allowed all of
    its ports."""
    with DataServer(data, host="127.0.0.2") as other, Redirector(f"http://127.0.0.2:{other.port}", "127.0.0.2") as hop:
        allowed = [f"127.0.0.2:{hop.port}"]
        with live_plane(tmp_path, monkeypatch, allow_source_hosts=allowed) as api:
            r = api.call("alice", "POST", "/v1/datasets", json=dataset("direct", f"{other.url}/"))
            assert r.status_code == 422 and problem_fields(r) == ["source"], r.text
            assert f"on port {other.port}" in r.text
            r = api.call("alice", "POST", "/v1/datasets", json=dataset("hop", f"{hop.url}/"))
            assert r.status_code == 422 and problem_fields(r) == ["source"], r.text
        assert sum(other.requests.values()) == 0
        with live_plane(tmp_path, monkeypatch, allow_source_hosts=[f"127.0.0.2:{other.port}"]) as api:
            r = api.call("alice", "POST", "/v1/datasets", json=dataset("direct", f"{other.url}/"))
            assert r.status_code == 201 and r.json()["items"] == 5, r.text


@pytest.mark.parametrize("entry_host", ["127.0.0.1", "localhost"])
def test_an_allowed_port_is_not_a_way_to_the_hosts_other_ports(data, entry_host) -> None:
    """With only HOST:PORT allowed (by address or by name), every other spelling of another
    port of that host is refused before the victim sees a request: userinfo that looks like the
    allowed host and port, a decimal or hex IPv4, an IPv4-mapped IPv6, a redirect by name
    (caught by the resolver, which is given the port) and a scheme-relative one, an S3 endpoint
    (redteam32, s32)."""
    with DataServer(data) as ok, DataServer(data) as victim:
        guard = SourceGuard.of([], [f"{entry_host}:{ok.port}"])
        v = victim.port
        assert len(Source(f"http://{entry_host}:{ok.port}/", guard=guard, retries=0).list()) == 5
        for url in (
            f"http://{entry_host}:{v}/",
            f"http://{entry_host}:{ok.port}@{entry_host}:{v}/",
            f"http://2130706433:{v}/",
            f"http://0x7f.1:{v}/",
            f"http://[::ffff:127.0.0.1]:{v}/",
        ):
            with pytest.raises(SourceRefused):
                Source(url, guard=guard, retries=0).list()
        for target in (f"http://localhost:{v}", f"//localhost:{v}", f"http://127.0.0.1:{v}"):
            with Redirector(target, "127.0.0.1") as hop:
                hops = SourceGuard.of([], [f"{entry_host}:{hop.port}"])
                with pytest.raises(SourceRefused):
                    Source(f"http://{entry_host}:{hop.port}/", guard=hops, retries=0).list()
        with pytest.raises(SourceRefused) as err:
            guard.check("s3://b/d", {"endpoint_url": f"http://{entry_host}:{ok.port}@{entry_host}:{v}"})
        assert err.value.field == "storage_options.endpoint_url"
        assert sum(victim.requests.values()) == 0


def test_the_resolver_refuses_at_connect_time(data) -> None:
    """DNS rebinding: a name checked once may resolve elsewhere later; the client's resolver
    checks the address it is about to dial, so `localhost` is refused even when the up-front
    check was skipped."""
    import asyncio

    guard = SourceGuard()
    with pytest.raises(SourceRefused, match="sluice refused localhost"):
        asyncio.run(guard.resolver().resolve("localhost", 80))
    with DataServer(data) as srv:
        # Checked while the name "was" public (a public literal stands in for it) ...
        src = Source("http://93.184.216.34/", guard=guard, retries=0)
        # ... then it resolves to loopback, as a rebinding name would after the check.
        src.url = f"http://localhost:{srv.port}/"
        src.root = src.url.rstrip("/")
        with pytest.raises(SourceRefused, match="sluice refused localhost"):
            src.list()
        assert sum(srv.requests.values()) == 0


def test_source_refused_names_the_field() -> None:
    guard = SourceGuard.of([os.sep + "nonexistent-root"], [])
    with pytest.raises(SourceRefused) as err:
        guard.check("file:///etc/passwd")
    assert err.value.field == "source"
