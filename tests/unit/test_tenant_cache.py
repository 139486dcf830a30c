"""The node cache under tenant isolation: `dataset warm` fills, `dataset list` reports and
`dataset rm` empties the cache a tenant's jobs really read (its uid's own, `uid-<uid>`), and a
dataset deleted and registered again under its name never reads the old bytes.

The "job" here is a real process of the tenant's uid, given the environment a node agent gives
a job (`launch_env`, then `tenant_job_env` as `NodeAgent._tenant_cache_dirs` does), reading every
item the way `sluice.sdk.dataset` does. Tests that switch uids need root (as the suite runs in
CI); the rest run anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sluice.agent import tenant_cache
from sluice.agent.cache_report import CacheReporter
from sluice.agent.tenant_cache import (
    TenantCacheWatch,
    claim_tiers,
    drop_everywhere,
    fractions_of,
    tenant_dir,
    tenant_job_env,
    tenant_share,
    warm_as,
)
from sluice.control.datasets import DatasetService, cache_folder, generation
from sluice.data.cache import DatasetCache, dataset_id, reader_key
from sluice.data.guard import SourceGuard
from sluice.data.settings import CacheSettings
from sluice.model import ClusterView, JobUser, JobView, NodeView, Phase, dataset_of
from sluice.policy.data_aware import DataAwarePolicy
from sluice.spec import DatasetSpec
from sluice.store.base import DatasetRecord
from sluice.store.memory import MemoryStore
from tests.isolating import needs_root
from tests.live_api import serving

ALICE = JobUser(231_101, 231_101)
BOB = JobUser(231_102, 231_102)
USERS = {"alice": ALICE, "bob": BOB, "admin": JobUser(231_100, 231_100)}
ITEMS = 6


JOB = """
import hashlib, json, os
from sluice.data.handle import DatasetHandle
from sluice.sdk.dataset import _resolve
src, opts, key, gen = _resolve("imgs", None, None)
h = DatasetHandle(name=key, source=src, storage_options=opts, generation=gen,
                  disk_dir=os.environ["SLUICE_CACHE_DISK_DIR"], memory_dir=os.environ["SLUICE_CACHE_MEMORY_DIR"])
cd = h.reader().cached
data = b"".join(cd.read(i) for i in range(len(cd)))
cd.close(); cd.cache.drain()
c = cd.counters
print(json.dumps({"sha": hashlib.sha1(data).hexdigest(), "hits": c.hits_memory + c.hits_disk, "misses": c.misses}))
"""


@dataclass
class Caller:
    name: str
    admin: bool = False


def write_source(root: Path, fill: int) -> str:
    """ITEMS files of `fill` bytes (sizes change with `fill`); the sha1 of all of them, in order."""
    root.mkdir(parents=True, exist_ok=True)
    data = b""
    for i in range(ITEMS):
        body = bytes([fill]) * (300 + 10 * fill + i)
        (root / f"{i:02d}.bin").write_bytes(body)
        data += body
    return hashlib.sha1(data).hexdigest()


@pytest.fixture
def cache_settings(tmp_path: Path) -> CacheSettings:
    return CacheSettings(disk_dir=tmp_path / "cache", memory_dir=tmp_path / "mem", memory_bytes=16 << 20)


@pytest.fixture
def svc(tmp_path: Path, cache_settings: CacheSettings) -> DatasetService:
    """The plane's dataset service under isolation, on an engine without node agents (it
    works on the plane's own node, as the local engine's agent works on its own)."""
    return DatasetService(
        MemoryStore(),
        cache_settings,
        guard=SourceGuard.of([tmp_path], []),
        run_as=USERS.__getitem__,
        job_python=os.environ.get("SLUICE_JOB_PYTHON"),
    )


def run_job(svc: DatasetService, tenant: str) -> dict[str, Any]:
    """A job of `tenant` mounting `imgs`, run as the tenant's uid with the agent's environment."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin"), **svc.launch_env(tenant, ["imgs"])}
    user = USERS[tenant]
    tenant_job_env(env, svc.cache_settings, user)  # what NodeAgent._tenant_cache_dirs does
    python = os.environ.get("SLUICE_JOB_PYTHON") or sys.executable
    done = subprocess.run(
        [python, "-c", JOB],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        check=False,
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        umask=0o077,
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def held(settings: CacheSettings, user: JobUser, ds: str) -> list[Path]:
    """The files of cache folder `ds` in `user`'s own cache (both tiers)."""
    out: list[Path] = []
    for base in (settings.resolved_disk_dir(), settings.resolved_memory_dir()):
        folder = Path(base) / f"uid-{user.uid}" / ds
        if folder.is_dir():
            out += [p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".sluice")]
    return out


# ------------------------------------------------------------------ anywhere


def test_a_re_registered_dataset_has_a_cache_folder_of_its_own() -> None:
    spec = DatasetSpec(name="imgs", source="/data/imgs")
    old = DatasetRecord("alice", "imgs", spec, created_at=1_700_000_000.25)
    new = DatasetRecord("alice", "imgs", spec, created_at=1_700_000_100.5)
    assert generation(old) != generation(new)
    assert cache_folder(old) != cache_folder(new)
    assert cache_folder(old).startswith("alice~imgs-")
    # no generation (off-cluster, a bench): the folder it always had
    assert dataset_id("x", "/s") == dataset_id("x", "/s", None, "") != dataset_id("x", "/s", None, "1.0")


def test_the_job_gets_the_generation_and_opens_that_folder(
    svc: DatasetService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sluice.sdk.dataset import _resolve

    write_source(tmp_path / "src", 1)
    rec = svc.create(Caller("alice"), DatasetSpec(name="imgs", source=str(tmp_path / "src")))
    table = json.loads(svc.launch_env("alice", ["imgs"])["SLUICE_DATASETS"])
    assert table["imgs"]["generation"] == generation(rec)
    monkeypatch.setenv("SLUICE_DATASETS", json.dumps(table))
    src, opts, key, gen = _resolve("imgs", None, None)
    assert key is not None and dataset_id(key, src, opts, gen) == cache_folder(rec)


def test_remove_drops_every_copy_of_a_name_and_nothing_else(tmp_path: Path, cache_settings: CacheSettings) -> None:
    src = tmp_path / "src"
    write_source(src, 1)
    cache = DatasetCache(cache_settings)
    for gen in ("1.0", "2.0"):
        cache.open("alice/imgs", str(src), generation=gen).warm(2)
    cache.open("alice/imgs-2", str(src)).warm(2)  # another dataset, whose name starts alike
    stray = Path(cache.memory_dir) / dataset_id("alice/imgs", str(src), None, "0.5")  # the index forgot it
    stray.mkdir()
    (stray / "00.bin").write_bytes(b"old")
    assert cache.remove("alice/imgs") == 3
    left = {p.name for root in (cache.memory_dir, cache.disk_dir) for p in Path(root).iterdir() if p.is_dir()}
    assert left == {dataset_id("alice/imgs-2", str(src))}
    assert set(cache.state()[0]) == {"alice/imgs-2"}


def test_recovering_the_node_cache_leaves_tenants_caches_alone(tmp_path: Path, cache_settings: CacheSettings) -> None:
    """The agent recovers the shared cache as root when it starts: it must not walk into (let
    alone delete from) the tenants' own caches inside its folders, which its index never lists."""
    DatasetCache(cache_settings)
    theirs = [
        Path(base) / "uid-231101" / "alice~imgs-0123456789" / "00.bin"
        for base in (cache_settings.resolved_disk_dir(), cache_settings.resolved_memory_dir())
    ]
    for f in theirs:
        f.parent.mkdir(parents=True)
        f.write_bytes(b"cached by a job of uid 231101")
    report = DatasetCache(cache_settings).recover()
    assert report.orphans_removed == 0 and all(f.exists() for f in theirs)


def test_the_helper_warms_reports_and_drops_a_tenants_cache(tmp_path: Path, cache_settings: CacheSettings) -> None:
    """The helper process end to end, run as this process's own user (no switch needed)."""
    me = JobUser(os.geteuid(), os.getegid())
    write_source(tmp_path / "src", 7)
    guard = SourceGuard.of([tmp_path], [])
    report = warm_as(cache_settings, me, "n1", "alice/imgs", str(tmp_path / "src"), {}, 4, guard, "7.0")
    assert report.error is None, report.error
    assert (report.node, report.files_fetched, report.cached_fraction) == ("n1", ITEMS, 1.0)
    ds = dataset_id("alice/imgs", str(tmp_path / "src"), {}, "7.0")
    assert fractions_of(cache_settings, me) == {ds: 1.0}
    assert len(held(cache_settings, me, ds)) == ITEMS
    # the admin's source policy holds in the helper too
    refused = warm_as(cache_settings, me, "n1", "alice/etc", "/etc", {}, 4, guard, "7.0")
    assert refused.error is not None and "dataset_roots" in refused.error
    assert drop_everywhere(DatasetCache(cache_settings), cache_settings, "alice/imgs") == 1
    assert fractions_of(cache_settings, me) == {} and held(cache_settings, me, ds) == []


# ------------------------------------------------------------------ as tenant uids (root)


@needs_root
def test_warm_fills_the_cache_the_tenants_jobs_read(svc: DatasetService, tmp_path: Path) -> None:
    want = write_source(tmp_path / "src", 1)
    alice = Caller("alice")
    rec = svc.create(alice, DatasetSpec(name="imgs", source=str(tmp_path / "src")))
    [report] = svc.warm(alice, "imgs")
    assert report.error is None, report.error
    assert (report.files_fetched, report.cached_fraction) == (ITEMS, 1.0)
    # what `dataset list` shows as cached here is alice's own cache, which her job then hits
    assert svc.cached_here(alice, [rec]) == {"alice/imgs": 1.0}
    assert run_job(svc, "alice") == {"sha": want, "hits": ITEMS, "misses": 0}
    # ... filled as her uid, where only her uid reaches it (docs/security.md)
    files = held(svc.cache_settings, ALICE, cache_folder(rec))
    assert len(files) == ITEMS and all(f.stat().st_uid == ALICE.uid for f in files)
    own = Path(svc.cache_settings.resolved_disk_dir()) / f"uid-{ALICE.uid}"
    assert (own.stat().st_uid, stat.S_IMODE(own.stat().st_mode)) == (ALICE.uid, 0o700)
    # nothing went to the shared cache (no job reads it under isolation), nor to bob's
    assert svc.node_cache().state()[0] == {}
    assert held(svc.cache_settings, BOB, cache_folder(rec)) == []
    assert svc.cached_here(Caller("bob"), [rec]) == {"alice/imgs": 0.0}


@needs_root
def test_a_published_dataset_is_warmed_into_the_readers_own_cache(svc: DatasetService, tmp_path: Path) -> None:
    want = write_source(tmp_path / "src", 2)
    rec = svc.create(Caller("alice"), DatasetSpec(name="imgs", source=str(tmp_path / "src")))
    svc.publish(Caller("admin", admin=True), "imgs", "alice")
    [report] = svc.warm(Caller("bob"), "imgs")
    assert report.error is None and report.files_fetched == ITEMS, report
    assert run_job(svc, "bob") == {"sha": want, "hits": ITEMS, "misses": 0}
    assert held(svc.cache_settings, ALICE, cache_folder(rec)) == []  # bob's warm is bob's
    assert svc.cached_here(Caller("bob"), [rec]) == {"alice/imgs": 1.0}
    assert svc.cached_here(Caller("alice"), [rec]) == {"alice/imgs": 0.0}
    # an admin acts for the owner: its warm fills alice's
    [report] = svc.warm(Caller("admin", admin=True), "imgs", tenant="alice")
    assert report.files_fetched == ITEMS and len(held(svc.cache_settings, ALICE, cache_folder(rec))) == ITEMS
    # rm empties every tenant's copy of it: the owner's before it answers, the others' just after
    assert svc.delete(Caller("alice"), "imgs") == {socket.gethostname(): "removed"}
    assert held(svc.cache_settings, ALICE, cache_folder(rec)) == []
    assert tenant_cache.background_drops.wait(60)
    for user in (ALICE, BOB):
        assert held(svc.cache_settings, user, cache_folder(rec)) == []


@needs_root
def test_rm_empties_the_tenants_cache_and_a_recreated_dataset_reads_new_bytes(
    svc: DatasetService, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    first = write_source(src, 3)
    alice = Caller("alice")
    rec = svc.create(alice, DatasetSpec(name="imgs", source=str(src)))
    svc.warm(alice, "imgs")
    assert run_job(svc, "alice")["misses"] == 0
    assert svc.delete(alice, "imgs") == {socket.gethostname(): "removed"}
    for base in (svc.cache_settings.resolved_disk_dir(), svc.cache_settings.resolved_memory_dir()):
        assert not list((Path(base) / f"uid-{ALICE.uid}").glob("alice~imgs-*")), base
    # same name, same source folder, new bytes: the job fetches them all
    shutil.rmtree(src)
    second = write_source(src, 4)
    assert second != first
    new = svc.create(alice, DatasetSpec(name="imgs", source=str(src)))
    assert svc.cached_here(alice, [new]) == {"alice/imgs": 0.0}
    assert run_job(svc, "alice") == {"sha": second, "hits": 0, "misses": ITEMS}
    assert cache_folder(new) != cache_folder(rec)


@needs_root
def test_a_copy_rm_could_not_reach_is_never_served_to_the_recreated_dataset(
    svc: DatasetService, tmp_path: Path
) -> None:
    """A node down during `rm` keeps its copy (or a job still running writes one back): the
    re-created dataset is another generation, so its jobs read the source, not that copy."""
    src = tmp_path / "src"
    write_source(src, 5)
    alice = Caller("alice")
    old = svc.create(alice, DatasetSpec(name="imgs", source=str(src)))
    svc.warm(alice, "imgs")
    svc.delete(alice, "imgs", purge_cache=False)
    assert len(held(svc.cache_settings, ALICE, cache_folder(old))) == ITEMS  # still there
    shutil.rmtree(src)
    second = write_source(src, 6)
    new = svc.create(alice, DatasetSpec(name="imgs", source=str(src)))
    assert svc.cached_here(alice, [new]) == {"alice/imgs": 0.0}
    assert run_job(svc, "alice") == {"sha": second, "hits": 0, "misses": ITEMS}


def _fake_helper(tmp_path: Path, body: str) -> str:
    """An "interpreter" that ignores its arguments and does `body` (a shell line)."""
    script = tmp_path / "fake-python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_a_helper_that_writes_without_end_or_never_answers_is_killed(tmp_path: Path) -> None:
    """The helper runs as the tenant's uid, so the tenant's own jobs can tamper with it: the
    plane reads at most MAX_ANSWER_BYTES of it and waits no longer than the timeout."""
    from sluice.agent.tenant_cache import MAX_ANSWER_BYTES, TenantCacheError, run_helper

    me = JobUser(os.geteuid(), os.getegid())
    flood = _fake_helper(tmp_path, f"head -c {4 * MAX_ANSWER_BYTES} /dev/zero; sleep 30")
    with pytest.raises(TenantCacheError, match="wrote more than"):
        run_helper(me, {"op": "fractions"}, 20.0, flood)
    stuck = _fake_helper(tmp_path, "sleep 30")
    with pytest.raises(TenantCacheError, match=r"took over 0\.5 s"):
        run_helper(me, {"op": "fractions"}, 0.5, stuck)
    fine = _fake_helper(tmp_path, "cat >/dev/null; echo noise; echo '{\"fractions\": {}}'")
    assert run_helper(me, {"op": "fractions"}, 5.0, fine) == {"fractions": {}}


@needs_root
def test_nodes_report_each_tenants_own_cache_and_placement_reads_the_readers_copy(
    svc: DatasetService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under isolation a job reads only its uid's copy: the node's report carries each
    tenant's copy under its own key (read by a helper of that uid), `dataset list`'s CACHED ON
    NODES and data-aware placement look up the reader's key, never another tenant's."""
    write_source(tmp_path / "src", 4)
    alice, bob = Caller("alice"), Caller("bob")
    rec = svc.create(alice, DatasetSpec(name="imgs", source=str(tmp_path / "src")))
    svc.publish(Caller("admin", admin=True), "imgs", "alice")
    [report] = svc.warm(alice, "imgs")
    assert report.error is None, report.error
    reporter = CacheReporter("n1", svc.cache_settings, interval_s=0.0, job_python=os.environ.get("SLUICE_JOB_PYTHON"))
    reporter.tenants.refresh(0.0, wait=True)
    event = reporter.poll(1.0, [])
    mine = reader_key(ALICE.uid, cache_folder(rec))
    assert event is not None and event.datasets == {mine: 1.0}  # no shared cache: only alice's
    by_node = {"n1": event.datasets, "n2": {}}
    assert svc.cached_on(alice, [rec], by_node) == {"alice/imgs": {"n1": 1.0}}
    assert svc.cached_on(bob, [rec], by_node) == {"alice/imgs": {}}  # bob's jobs would not find it
    # the controller's job view keys the job's data like the reports of its reader's copy
    assert svc.dataset_bytes("alice", ["imgs"]) == {mine: rec.total_bytes}
    assert list(svc.dataset_bytes("bob", ["imgs"])) == [reader_key(BOB.uid, cache_folder(rec))]
    nodes = {n: NodeView(name=n, cpu=2, gpus=0, memory_mb=1024, cached_datasets=by_node[n]) for n in ("n2", "n1")}
    for tenant, where in (("alice", "n1"), ("bob", None)):
        sizes = svc.dataset_bytes(tenant, ["imgs"])
        job = JobView(
            id=tenant,
            name=tenant,
            tenant=tenant,
            phase=Phase.QUEUED,
            submitted_at=0.0,
            datasets=tuple(sizes),
            dataset_bytes=sizes,
        )
        [decision] = DataAwarePolicy().decide(ClusterView(now=0.0, nodes=nodes, jobs={job.id: job}))
        share = "100%" if where else "0%"
        assert f"{share} of its data (alice/imgs)" in decision.reason, decision.reason
        if where:
            assert decision.reason.startswith(f"data-aware: placed on {where}")
    # a helper runs again only when the tenant's cache changed
    calls: list[int] = []
    real = tenant_cache.fractions_of
    monkeypatch.setattr(
        tenant_cache, "fractions_of", lambda s, u, p=None, share=None: calls.append(u.uid) or real(s, u, p, share)
    )
    reporter.tenants.refresh(2.0, wait=True)
    assert calls == []
    svc.delete(alice, "imgs")
    reporter.tenants.refresh(3.0, wait=True)
    gone = reporter.poll(4.0, [])
    reporter.close()
    assert calls[0] == ALICE.uid and gone is not None and gone.datasets == {}  # emptied: said so


def test_a_tenants_answer_only_names_cache_folders_and_is_bounded(
    cache_settings: CacheSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer comes from a process of the tenant's uid: keys that are not cache folders
    are dropped (they could not match another key anyway: each is prefixed with the uid)."""
    me = JobUser(os.geteuid(), os.getegid())
    tenant_dir(cache_settings.resolved_disk_dir(), me)
    many = {f"alice~x-{i:010x}": 1.0 for i in range(tenant_cache.MAX_REPORTED + 50)}
    bad = {"../../etc": 1.0, "alice/imgs": 1.0, "uid-1:alice~y-0123456789": 1.0, "a" * 300 + "-0123456789": 1.0}
    monkeypatch.setattr(tenant_cache, "fractions_of", lambda s, u, p=None, share=None: {**many, **bad})
    watch = TenantCacheWatch(cache_settings)
    watch.refresh(0.0, wait=True)
    got = watch.entries()
    assert len(got) == tenant_cache.MAX_REPORTED
    assert all(k.startswith(f"uid-{me.uid}:alice~x-") for k in got)


def test_a_reader_key_names_its_dataset() -> None:
    """`dataset_of` (model: what policies and metrics read) undoes `reader_key` (data: what
    nodes report), for any dataset name sluice accepts."""
    for owner, name in (("alice", "imgs"), ("a.b-c_d", "x.y-z_9"), ("t1", "0")):
        folder = dataset_id(f"{owner}/{name}", "s3://b/p", {"anon": True}, "12.5")
        assert dataset_of(reader_key(1234, folder)) == f"{owner}/{name}"
        assert dataset_of(f"{owner}/{name}") == f"{owner}/{name}"


def test_a_tenant_cache_that_cannot_be_read_is_tried_again_only_when_it_changes(
    cache_settings: CacheSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    me = JobUser(os.geteuid(), os.getegid())
    own = tenant_dir(cache_settings.resolved_disk_dir(), me)
    calls: list[int] = []

    def broken(s: CacheSettings, u: JobUser, p: str | None = None, share: object = None) -> dict[str, float]:
        calls.append(u.uid)
        raise tenant_cache.TenantCacheError("cannot run the cache helper")

    monkeypatch.setattr(tenant_cache, "fractions_of", broken)
    watch = TenantCacheWatch(cache_settings)
    for now in (0.0, 10.0, 20.0):
        watch.refresh(now, wait=True)
    assert len(calls) == 1 and watch.entries() == {}  # no helper (nor warning) every period
    (own / "index.sqlite").write_bytes(b"x")
    watch.refresh(30.0, wait=True)
    watch.refresh(30.0 + tenant_cache.REPORT_MAX_AGE_S, wait=True)
    assert len(calls) == 3


def capacity_as(settings: CacheSettings, user: JobUser) -> dict[str, int]:
    """tier -> capacity of `user`'s own cache, read by a process of that uid (root opening the
    tenant's index would leave root-owned WAL files in its folder)."""
    index = Path(settings.resolved_disk_dir()) / f"uid-{user.uid}" / "index.sqlite"
    code = (
        "import json, sys; from sluice.data.index import Index; "
        "print(json.dumps({t: c for t, (_u, c) in Index(sys.argv[1], 0.01).usage().items()}))"
    )
    python = os.environ.get("SLUICE_JOB_PYTHON") or sys.executable
    done = subprocess.run(
        [python, "-c", code, str(index)], capture_output=True, text=True, check=True, user=user.uid, group=user.gid
    )
    out: dict[str, int] = json.loads(done.stdout)
    return out


@needs_root
def test_each_tenants_cache_holds_its_share_of_the_nodes(svc: DatasetService, tmp_path: Path) -> None:
    """The node's tiers are split evenly among the tenants with a cache here: before, each
    tenant's cache was sized as if it were the node's only one (N tenants could fill N
    quarters of RAM in /dev/shm). A job is given its share at launch, and a cache sized for
    fewer tenants is shrunk to its share by the node's next cache report — never grown."""
    settings = svc.cache_settings  # memory tier 16 MiB, disk tier 20 GiB
    mem, disk = 16 << 20, settings.disk_bytes
    assert tenant_share(settings) == (mem, disk)  # no tenant cache here yet
    want = write_source(tmp_path / "src", 3)
    svc.create(Caller("alice"), DatasetSpec(name="imgs", source=str(tmp_path / "src")))
    svc.publish(Caller("admin", admin=True), "imgs", "alice")
    assert run_job(svc, "alice")["sha"] == want
    assert capacity_as(settings, ALICE) == {"memory": mem, "disk": disk}  # alone: the node's
    env = dict(svc.launch_env("bob", ["imgs"]))
    tenant_job_env(env, settings, BOB)
    assert (env["SLUICE_CACHE_MEMORY_BYTES"], env["SLUICE_CACHE_DISK_BYTES"]) == (str(mem // 2), str(disk // 2))
    assert run_job(svc, "bob")["sha"] == want
    assert capacity_as(settings, BOB) == {"memory": mem // 2, "disk": disk // 2}
    assert capacity_as(settings, ALICE) == {"memory": mem, "disk": disk}  # sized for one, until...
    TenantCacheWatch(settings, os.environ.get("SLUICE_JOB_PYTHON")).refresh(0.0, wait=True)
    assert capacity_as(settings, ALICE) == {"memory": mem // 2, "disk": disk // 2}  # ... the report
    # a share above what a cache holds leaves it as it is
    fractions_of(settings, ALICE, os.environ.get("SLUICE_JOB_PYTHON"), (mem, disk))
    assert capacity_as(settings, ALICE) == {"memory": mem // 2, "disk": disk // 2}
    # and a warm fills within the share
    [report] = svc.warm(Caller("bob"), "imgs")
    assert report.error is None, report.error
    assert capacity_as(settings, BOB) == {"memory": mem // 2, "disk": disk // 2}


@needs_root
def test_a_tier_folder_a_job_made_first_is_never_used(tmp_path: Path, cache_settings: CacheSettings) -> None:
    """The memory tier's name in /dev/shm is predictable and /dev/shm is everyone's: a tenant's
    job that makes it first would own every tenant's cache folder made inside it (and could
    poison or move them). The agent makes both tiers as the plane's when it starts, and a
    folder that is not the plane's is refused, naming its owner."""
    assert claim_tiers(cache_settings) == []  # made now, as the plane's
    mem = cache_settings.resolved_memory_dir()
    assert (mem.stat().st_uid, stat.S_IMODE(mem.stat().st_mode)) == (os.geteuid(), 0o711)
    assert tenant_dir(mem, BOB).parent == mem
    shutil.rmtree(mem)
    mem.mkdir(mode=0o777)  # what alice's job does before the plane gets there
    os.chown(mem, ALICE.uid, ALICE.gid)
    planted = mem / f"uid-{BOB.uid}"
    planted.mkdir()
    os.chown(planted, ALICE.uid, ALICE.gid)
    [problem] = claim_tiers(cache_settings)
    assert str(mem) in problem and f"uid {ALICE.uid}" in problem
    with pytest.raises(OSError, match="not to the plane"):
        tenant_dir(mem, BOB)
    assert planted.stat().st_uid == ALICE.uid  # nothing was handed to bob inside her folder


@needs_root
def test_create_lists_a_local_source_with_the_tenants_own_permissions(svc: DatasetService, tmp_path: Path) -> None:
    """The plane (root) listed a local source at `dataset create`: Alice registered Bob's 0700
    folder under dataset_roots and learned how many files it held and their total size, and a
    file name the listing refused came back in the error. Now the listing runs as the owner's
    uid: Alice gets a 422 naming `source` and nothing of the folder; Bob's own create works."""
    from sluice.spec import SpecError

    private = tmp_path / "bob-private"
    write_source(private, 3)
    (private / "q3-layoffs\\list.xlsx").write_bytes(b"x")
    for p in (private, *private.iterdir()):
        os.chown(p, BOB.uid, BOB.gid)
    private.chmod(0o700)
    with pytest.raises(SpecError) as refused:
        svc.create(Caller("alice"), DatasetSpec(name="peek", source=str(private)))
    [problem] = refused.value.problems
    assert problem.field == "source" and "Permission denied" in problem.problem, problem
    assert "layoffs" not in problem.problem and "items" not in problem.problem
    assert svc.store.get_dataset("alice", "peek") is None
    (private / "q3-layoffs\\list.xlsx").unlink()
    rec = svc.create(Caller("bob"), DatasetSpec(name="mine", source=str(private)))
    assert rec.items == ITEMS


@needs_root
def test_listings_share_one_helper_per_tenant_and_rerun_it_only_on_change(
    svc: DatasetService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every `dataset list`/`get` under isolation started a helper process as the caller's uid
    (~0.7 s each): sixty parallel listings of one tenant loaded a 2-core plane to 16 and another
    tenant's requests took 10 s. Now a listing reuses the last answer while the tenant's cache
    is unchanged, and one that comes while the tenant's helper runs does not start another."""
    import threading

    write_source(tmp_path / "src", 1)
    alice = Caller("alice")
    rec = svc.create(alice, DatasetSpec(name="imgs", source=str(tmp_path / "src")))
    [report] = svc.warm(alice, "imgs")
    assert report.error is None, report.error
    calls: list[int] = []
    gate = threading.Event()
    real = tenant_cache.fractions_of

    def counted(s: CacheSettings, u: JobUser, p: str | None = None) -> dict[str, float]:
        calls.append(u.uid)
        gate.wait(10)
        return real(s, u, p)

    monkeypatch.setattr(tenant_cache, "fractions_of", counted)
    monkeypatch.setattr("sluice.control.datasets.fractions_of", counted, raising=False)  # where it was called
    first = threading.Thread(target=svc.cached_here, args=(alice, [rec]))
    first.start()
    for _ in range(100):
        if calls:
            break
        threading.Event().wait(0.02)
    assert svc.cached_here(alice, [rec]) is not None  # answered at once, with no helper of its own
    gate.set()
    first.join(10)
    assert len(calls) == 1
    for _ in range(5):
        assert svc.cached_here(alice, [rec]) == {"alice/imgs": 1.0}
    assert len(calls) == 1  # the cache did not change: no helper
    svc.delete(alice, "imgs")
    assert svc.cached_here(alice, []) == {}
    svc.create(alice, DatasetSpec(name="imgs", source=str(tmp_path / "src")))
    assert svc.cached_here(alice, [svc.get(alice, "imgs")]) == {"alice/imgs": 0.0}
    assert len(calls) == 2  # emptied by rm: read again


def test_a_warm_whose_helper_failed_says_how_long_it_ran(
    tmp_path: Path, cache_settings: CacheSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper killed at its memory limit after 26 s of reading was reported as `warming fifo
    failed after 0.0 s: ...went past its memory limit` (data walk s31)."""
    now = [100.0]
    monkeypatch.setattr(tenant_cache.time, "monotonic", lambda: now[0])

    def killed(*_args: Any, **_kw: Any) -> dict[str, Any]:
        now[0] += 26.5  # the helper read for 26.5 s, then was killed
        raise tenant_cache.TenantCacheError("the cache helper (warm) went past its memory limit")

    monkeypatch.setattr(tenant_cache, "run_helper", killed)
    me = JobUser(os.geteuid(), os.getegid())
    report = warm_as(cache_settings, me, "n1", "alice/imgs", str(tmp_path / "src"), {}, 4, SourceGuard(), "7.0")
    assert report.error is not None and "memory limit" in report.error
    assert report.seconds == 26.5


def test_a_warm_from_a_source_that_never_answers_is_killed_at_its_time_limit(
    tmp_path: Path, cache_settings: CacheSettings
) -> None:
    """A tenant's source that lists an item and then never sends it held its warm, an API
    thread and one of the plane's few source slots for as long as it liked (data walk s31): the
    helper is killed at `warm_timeout_s` and the warm fails, naming the setting."""
    import http.server
    import threading

    release = threading.Event()

    class Hangs(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.endswith("/"):
                body = b'<a href="a.bin">a.bin</a>'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            release.wait(60)  # the item: never sent

        def do_HEAD(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "10")
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    with serving(Hangs) as server:
        try:
            me = JobUser(os.geteuid(), os.getegid())
            url = f"http://127.0.0.1:{server.server_address[1]}/set/"
            quick = cache_settings.model_copy(update={"warm_timeout_s": 2.0})
            report = warm_as(quick, me, "n1", "alice/slow", url, {}, 4, SourceGuard.of([], ["127.0.0.1"]), "7.0")
            assert report.error is not None and "took over 2 s" in report.error, report
            assert "SLUICE_CACHE_WARM_TIMEOUT_S" in report.error and 2.0 <= report.seconds < 30
        finally:
            release.set()  # before the server closes: it waits for its handlers
