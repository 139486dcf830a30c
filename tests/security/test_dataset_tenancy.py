"""Issue 10, part 4: the dataset cache is per tenant, and only an admin publishes to everyone.

Tenants alice and bob both register a dataset named `imgs` (different bytes) and warm it into
the plane's real node cache — under isolation (the tests run as root) into each tenant's own
cache, the one its jobs read. Bob then tries, through the API, to list, read, warm, purge and
publish alice's; each attempt fails (404 for what he may not see, 403 for what he may see but
not change) and alice's cached bytes stay where they were.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from sluice.control.datasets import cache_folder
from sluice.data.cache import index_fractions, reader_key
from sluice.data.index import Index
from sluice.model import dataset_of

from .confine_helpers import Api, live_plane

pytestmark = pytest.mark.integration


def make_source(root: Path, fill: int) -> Path:
    root.mkdir(parents=True)
    for i in range(4):
        (root / f"{i}.bin").write_bytes(bytes([fill]) * (200 + i))
    return root


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    with live_plane(tmp_path, monkeypatch, dataset_roots=[str(tmp_path / "data")]) as api:
        for who, fill in (("alice", 1), ("bob", 2)):
            src = make_source(tmp_path / "data" / who, fill)
            r = api.call(who, "POST", "/v1/datasets", json={"name": "imgs", "source": str(src)})
            assert r.status_code == 201, r.text
            r = api.call(who, "POST", "/v1/datasets/imgs/warm")
            assert r.status_code == 200 and r.json()["nodes"][0]["files_fetched"] == 4, r.text
        yield api


def tiers(api: Api, tenant: str) -> list[Path]:
    """The cache folders `tenant`'s jobs read on the plane's node: its uid's own under isolation
    (`uid-<uid>`, 0700), else the node's shared ones. Memory tier first, then disk (and index)."""
    cs = api.plane.datasets.cache_settings
    shared = [Path(cs.resolved_memory_dir()), Path(cs.resolved_disk_dir())]
    if not api.plane.isolation.enabled:
        return shared
    return [t / f"uid-{api.plane.job_user(tenant).uid}" for t in shared]


def cached(api: Api, tenant: str) -> dict[str, float]:
    """Cache key -> share held in the cache `tenant`'s jobs read (read from its index as root:
    the test may, the plane does not)."""
    path = tiers(api, tenant)[1] / "index.sqlite"
    if not path.exists():
        return {}
    out: dict[str, float] = {}
    for (_ds, name), frac in index_fractions(Index(str(path), 0.01)).items():
        out[name] = max(out.get(name, 0.0), frac)
    return out


def test_same_name_two_tenants_two_cache_entries(api: Api, tmp_path: Path) -> None:
    assert cached(api, "alice")["alice/imgs"] == cached(api, "bob")["bob/imgs"] == 1.0
    if api.plane.isolation.enabled:  # each tenant's warm filled its own cache, nothing else
        assert set(cached(api, "alice")) == {"alice/imgs"} and set(cached(api, "bob")) == {"bob/imgs"}
    [mine] = api.call("bob", "GET", "/v1/datasets").json()["items"]
    assert (mine["tenant"], mine["cached_fraction"], mine["published"]) == ("bob", 1.0, False)
    assert "alice" not in mine["source"]
    # what bob's jobs read: his own bytes, under his own cache key
    env = json.loads(api.plane.datasets.launch_env("bob", ["imgs"])["SLUICE_DATASETS"])
    assert env["imgs"]["cache_key"] == "bob/imgs" and env["imgs"]["source"].endswith("/bob")
    for who, fill in (("alice", 1), ("bob", 2)):
        rec = api.plane.store.get_dataset(who, "imgs")
        assert rec is not None
        ds = cache_folder(rec)
        [held] = [t / ds / "0.bin" for t in tiers(api, who) if (t / ds / "0.bin").exists()]
        assert held.read_bytes() == bytes([fill]) * 200  # each tenant's own bytes, in its own folder
        if api.plane.isolation.enabled:  # ... which no other tenant's uid may open
            uid = api.plane.job_user(who).uid
            assert (held.stat().st_uid, stat.S_IMODE(held.stat().st_mode)) == (uid, 0o600)
            own = tiers(api, who)[0].stat()
            assert (own.st_uid, stat.S_IMODE(own.st_mode)) == (uid, 0o700)


def test_bob_cannot_reach_alices_dataset(api: Api, tmp_path: Path) -> None:
    for method, path in (
        ("GET", "/v1/datasets/imgs?tenant=alice"),
        ("POST", "/v1/datasets/imgs/warm?tenant=alice"),
        ("DELETE", "/v1/datasets/imgs?tenant=alice"),
    ):
        r = api.call("bob", method, path)
        assert r.status_code == 404, (method, path, r.text)
    r = api.call("bob", "POST", "/v1/datasets/imgs/publish?tenant=alice")
    assert r.status_code == 403
    r = api.call("bob", "POST", "/v1/datasets/imgs/publish")  # not even his own: admins publish
    assert r.status_code == 403
    # bob purges his own `imgs`: only his cache entry goes
    r = api.call("bob", "DELETE", "/v1/datasets/imgs")
    assert r.status_code == 200, r.text
    assert "bob/imgs" not in cached(api, "bob") and "bob/imgs" not in cached(api, "alice")
    assert cached(api, "alice")["alice/imgs"] == 1.0
    assert api.call("alice", "GET", "/v1/datasets/imgs").json()["cached_fraction"] == 1.0
    # and with his own gone, alice's (unpublished) is still invisible to him
    assert api.call("bob", "GET", "/v1/datasets").json()["items"] == []
    assert api.call("bob", "GET", "/v1/datasets/imgs").status_code == 404
    r = api.call("bob", "POST", "/v1/jobs", json={"command": ["python", "t.py"], "datasets": [{"name": "imgs"}]})
    assert r.status_code == 422 and r.json()["problems"][0]["field"] == "datasets"


def test_an_admin_publishes_a_dataset_to_every_tenant(api: Api) -> None:
    api.call("bob", "DELETE", "/v1/datasets/imgs")
    r = api.call("admin", "POST", "/v1/datasets/imgs/publish?tenant=alice")
    assert r.status_code == 200 and r.json()["published"] is True, r.text
    [seen] = api.call("bob", "GET", "/v1/datasets").json()["items"]
    assert (seen["tenant"], seen["name"], seen["published"]) == ("alice", "imgs", True)
    assert api.call("bob", "GET", "/v1/datasets/imgs").status_code == 200
    # bob may warm it (its cache key is alice/imgs), mount it, but not delete it. Under
    # isolation his jobs read his own cache, so that is where his warm puts it.
    r = api.call("bob", "POST", "/v1/datasets/imgs/warm")
    [warmed] = r.json()["nodes"]
    assert r.status_code == 200 and warmed["files_fetched" if api.plane.isolation.enabled else "already_cached"] == 4
    assert set(cached(api, "bob")) == {"alice/imgs"}
    assert api.call("bob", "GET", "/v1/datasets/imgs").json()["cached_fraction"] == 1.0
    r = api.call("bob", "DELETE", "/v1/datasets/imgs")
    assert r.status_code == 403 and "published" in r.text
    r = api.call("bob", "POST", "/v1/jobs", json={"command": ["python", "t.py"], "datasets": [{"name": "imgs"}]})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    # the job reads the published entry, and placement weighs it under the nodes' cache key
    env = json.loads(api.plane.datasets.launch_env("bob", ["imgs"])["SLUICE_DATASETS"])
    assert env["imgs"]["cache_key"] == "alice/imgs"
    # (under isolation: the copy in bob's own cache, which is the one his jobs read)
    rec = api.plane.datasets.resolve("bob", "imgs")
    assert rec is not None
    key = reader_key(api.plane.job_user("bob").uid, cache_folder(rec)) if api.plane.isolation.enabled else "alice/imgs"
    assert dataset_of(key) == "alice/imgs"
    assert api.plane.datasets.dataset_bytes("bob", ["imgs"]) == {key: sum(200 + i for i in range(4))}
    with api.plane.controller.lock:
        api.plane.controller.step()
        view = api.plane.controller.view()
    assert view.jobs[job_id].datasets == (key,)
    # a second published dataset of one name would make mounts ambiguous: 409
    r = api.call("bob", "POST", "/v1/datasets", json={"name": "imgs", "source": str(Path(env["imgs"]["source"]))})
    assert r.status_code == 201  # bob may still have his own of that name (his own wins for him)
    assert api.call("admin", "POST", "/v1/datasets/imgs/publish?tenant=bob").status_code == 409
    assert api.call("bob", "GET", "/v1/datasets/imgs").json()["tenant"] == "bob"
    # withdrawn: alice's alone again
    api.call("bob", "DELETE", "/v1/datasets/imgs")
    assert api.call("admin", "DELETE", "/v1/datasets/imgs/publish?tenant=alice").status_code == 200
    assert api.call("bob", "GET", "/v1/datasets").json()["items"] == []
    assert api.call("bob", "GET", "/v1/datasets/imgs").status_code == 404
