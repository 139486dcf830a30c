"""Issue 10, part 4: the dataset cache is per tenant, and only an admin publishes to everyone.

Tenants alice and bob both register a dataset named `imgs` (different bytes) and warm it into
the plane's real node cache. Bob then tries, through the API, to list, read, warm, purge and
publish alice's; each attempt fails (404 for what he may not see, 403 for what he may see but
not change) and alice's cached bytes stay where they were.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.data.cache import cache_key, dataset_id

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


def cached(api: Api) -> dict[str, float]:
    return api.plane.datasets.node_cache().state()[0]


def test_same_name_two_tenants_two_cache_entries(api: Api, tmp_path: Path) -> None:
    assert cached(api) == {"alice/imgs": 1.0, "bob/imgs": 1.0}
    [mine] = api.call("bob", "GET", "/v1/datasets").json()["items"]
    assert (mine["tenant"], mine["cached_fraction"], mine["published"]) == ("bob", 1.0, False)
    assert "alice" not in mine["source"]
    # what bob's jobs read: his own bytes, under his own cache key
    env = json.loads(api.plane.datasets.launch_env("bob", ["imgs"])["SLUICE_DATASETS"])
    assert env["imgs"]["cache_key"] == "bob/imgs" and env["imgs"]["source"].endswith("/bob")
    cs = api.plane.datasets.cache_settings
    tiers = [Path(cs.resolved_memory_dir()), Path(cs.resolved_disk_dir())]
    for who, fill in (("alice", 1), ("bob", 2)):
        ds = dataset_id(cache_key(who, "imgs"), str(tmp_path / "data" / who), {})
        [held] = [t / ds / "0.bin" for t in tiers if (t / ds / "0.bin").exists()]
        assert held.read_bytes() == bytes([fill]) * 200  # each tenant's own bytes, in its own folder


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
    assert cached(api) == {"alice/imgs": 1.0}
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
    # bob may warm it (the shared entry, alice/imgs), mount it, but not delete it
    r = api.call("bob", "POST", "/v1/datasets/imgs/warm")
    assert r.status_code == 200 and r.json()["nodes"][0]["already_cached"] == 4, r.text
    assert set(cached(api)) == {"alice/imgs"}
    r = api.call("bob", "DELETE", "/v1/datasets/imgs")
    assert r.status_code == 403 and "published" in r.text
    r = api.call("bob", "POST", "/v1/jobs", json={"command": ["python", "t.py"], "datasets": [{"name": "imgs"}]})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    # the job reads the published entry, and placement weighs it under the nodes' cache key
    env = json.loads(api.plane.datasets.launch_env("bob", ["imgs"])["SLUICE_DATASETS"])
    assert env["imgs"]["cache_key"] == "alice/imgs"
    assert api.plane.datasets.dataset_bytes("bob", ["imgs"]) == {"alice/imgs": sum(200 + i for i in range(4))}
    with api.plane.controller.lock:
        api.plane.controller.step()
        view = api.plane.controller.view()
    assert view.jobs[job_id].datasets == ("alice/imgs",)
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
