"""Publishing a dataset whose storage options hold credentials hands them to every tenant.

A job that mounts a dataset gets its storage options in SLUICE_DATASETS (its own misses fetch
from the source), and any tenant may mount a published dataset. So publishing alice's
`s3://…` dataset registered with her `key`/`secret` put that secret into the environment of
every other tenant's job that named it — while the API shows only the option names, even to
alice (red team s26). Now `publish` refuses such a dataset (409 naming the options) unless
the admin says the credentials are meant to be shared (`with_credentials`, CLI
`--with-credentials`: a read-only key made for it).

A password in the source URL (`https://alice:pw@host/imgs/`, which fsspec's HTTP client sends
as basic auth) is a credential too: `publish` took it without a word, and every tenant's
`dataset list` then showed it whole, as jobs got it (data walk s31). Now it is refused the same
way, and the API writes the password as `***` (to anyone: the options are shown by name only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from sluice.control.datasets import DatasetService
from sluice.control.errors import Conflict
from sluice.data.settings import CacheSettings
from sluice.spec import DatasetSpec
from sluice.store.base import DatasetRecord
from sluice.store.memory import MemoryStore

SECRET = "wJalrXUtnFEMI-alice-only"


@dataclass
class Caller:
    name: str
    admin: bool = False


def _svc(tmp_path: Path) -> DatasetService:
    store = MemoryStore()
    spec = DatasetSpec(
        name="imgs",
        source="s3://alice-bucket/imgs",
        storage_options={"key": "AKIAALICE", "secret": SECRET, "endpoint_url": "https://s3.example.com"},
    )
    store.create_dataset(DatasetRecord("alice", "imgs", spec, created_at=1.0, items=1, total_bytes=1))
    pub = DatasetSpec(name="open", source="s3://public/open", storage_options={"anon": True})
    store.create_dataset(DatasetRecord("alice", "open", pub, created_at=1.0, items=1, total_bytes=1))
    return DatasetService(store, CacheSettings(disk_dir=tmp_path / "c", memory_dir=tmp_path / "m"))


def test_publishing_a_dataset_with_credentials_is_refused(tmp_path: Path) -> None:
    svc = _svc(tmp_path)
    admin = Caller("admin", admin=True)
    with pytest.raises(Conflict, match=r"key, secret"):
        svc.publish(admin, "imgs", "alice")
    assert svc.published() == {}
    assert SECRET not in json.dumps(svc.launch_env("bob", ["imgs"]))  # bob cannot mount it
    # a dataset without credentials publishes as before
    svc.publish(admin, "open", "alice")
    assert svc.published() == {"open": "alice"}


def test_an_admin_may_share_them_on_purpose(tmp_path: Path) -> None:
    svc = _svc(tmp_path)
    svc.publish(Caller("admin", admin=True), "imgs", "alice", with_credentials=True)
    assert SECRET in json.dumps(svc.launch_env("bob", ["imgs"]))  # what was asked for


def test_a_password_in_the_source_url_is_a_credential_too(tmp_path: Path) -> None:
    from sluice.api.routes_datasets import dataset_out

    svc = _svc(tmp_path)
    spec = DatasetSpec(name="web", source=f"https://alice:{SECRET}@data.example.com/imgs/")
    svc.store.create_dataset(DatasetRecord("alice", "web", spec, created_at=1.0, items=1, total_bytes=1))
    admin = Caller("admin", admin=True)
    with pytest.raises(Conflict, match=r"a password in the source URL"):
        svc.publish(admin, "web", "alice")
    assert svc.published() == {}
    rec = svc.store.get_dataset("alice", "web")
    assert rec is not None
    shown = dataset_out(rec).source
    assert SECRET not in shown and shown == "https://alice:***@data.example.com/imgs/"
    svc.publish(admin, "web", "alice", with_credentials=True)  # on purpose, as for options
    assert svc.published() == {"web": "alice"}
    # nor in an S3 endpoint_url (a store behind a proxy that asks for basic auth)
    opts = {"endpoint_url": f"https://u:{SECRET}@minio.example.com", "anon": True}
    s3 = DatasetSpec(name="s3web", source="s3://b/imgs", storage_options=opts)
    svc.store.create_dataset(DatasetRecord("alice", "s3web", s3, created_at=1.0, items=1, total_bytes=1))
    with pytest.raises(Conflict, match=r"a password in storage option endpoint_url"):
        svc.publish(admin, "s3web", "alice")
    # a user name alone is no secret, and a local path with '@' and ':' is no URL
    for source in ("https://alice@data.example.com/imgs/", "/data/a:b@c/imgs"):
        assert dataset_out(DatasetRecord("alice", "x", DatasetSpec(name="x", source=source), 1.0)).source == source
