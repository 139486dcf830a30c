"""The dataset registry: tenants declare datasets, jobs mount them by name.

Visibility is per tenant: a tenant sees, warms, mounts and deletes its own datasets; an admin
sees all. A dataset that is not the caller's is reported as not found (never "forbidden"), so
names of other tenants' datasets do not leak. The node caches are per tenant too: a dataset's
cache key is `tenant/name`, so tenant B's `imgs` never reads, warms over or purges tenant A's
`imgs`. An admin may publish a dataset to every tenant: then any tenant lists it, reads it and
mounts it by name (its own dataset of that name wins), and all share one cache key — but only
its owner or an admin deletes it.

Under tenant isolation each tenant's jobs run as its own uid and read a cache of that uid's own
(`uid-<uid>` inside the node's cache folders, see agent/tenant_cache.py), so `warm` fills, and
`list`/`get` report, the cache of the tenant whose jobs will read the dataset: the caller's own
(for its own dataset or a published one; an admin's: the owner's). `rm` empties every copy:
the shared cache and every tenant's own. And a dataset's cache folder includes its
*generation* (`created_at`), so one deleted and registered again under the same name is never
served the old bytes, even from a node that was unreachable when it was deleted.

Registering checks the source against the admin's policy (data/guard.py: local roots, no
private addresses, safe storage options) and lists it once, so a typo in a URL is a clear 422
at `create` time rather than a job that dies on its first batch.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sluice.agent.tenant_cache import SharedFractions, TenantCacheError, drop_everywhere, list_as, warm_as
from sluice.control.auth import Caller
from sluice.control.errors import Conflict, Forbidden, NotFound
from sluice.control.resume import CopySlots
from sluice.data.cache import DatasetCache, cache_key, dataset_id, reader_key
from sluice.data.errors import DataError, SourceError
from sluice.data.guard import SourceGuard, SourceRefused, option_family
from sluice.data.index import Index
from sluice.data.settings import CacheSettings
from sluice.data.source import LIST_TIMEOUT_S, Source
from sluice.data.warm import WarmReport, warm_node
from sluice.engine.base import CacheWarmer
from sluice.model import JobUser
from sluice.spec import DatasetSpec, SpecError
from sluice.spec.dataset import relative_local_source, source_has_password
from sluice.spec.errors import FieldProblem
from sluice.store.base import DatasetRecord, DuplicateError, Store


def generation(rec: DatasetRecord) -> str:
    """Which registration of a dataset this is: it changes when the dataset is deleted and
    registered again, and is part of its cache folder (`dataset_id`), so a re-created dataset
    of the same name (and even the same source) never reads bytes cached for the old one."""
    return f"{rec.created_at:.6f}"


def cache_folder(rec: DatasetRecord) -> str:
    """The cache folder (`dataset_id`) the dataset's jobs read on every node."""
    return dataset_id(cache_key(rec.tenant, rec.name), rec.spec.source, rec.spec.storage_options, generation(rec))


CREDENTIAL_OPTIONS = frozenset({"key", "secret", "token"})
"""Storage options that are credentials (sluice.data.guard allows these and harmless ones)."""


class DatasetService:
    def __init__(
        self,
        store: Store,
        cache_settings: CacheSettings | None = None,
        engine: object | None = None,
        guard: SourceGuard | None = None,
        run_as: Callable[[str], JobUser] | None = None,
        job_python: str | None = None,
        slots: CopySlots | None = None,
        list_timeout_s: float = LIST_TIMEOUT_S,
    ) -> None:
        """`run_as`: under tenant isolation, the uid a tenant's jobs run as (whose own cache
        they read); None when jobs run as the plane's user and read the node's shared cache.
        `job_python`: the interpreter tenant uids run (settings job_python), for the helper
        that works in a tenant's own cache as its uid. `slots`: how many source operations
        (create's listing, warm) run at once, per tenant and in all: each holds an API worker
        thread for as long as the tenant's source takes, and unbounded, one tenant's parallel
        requests to a slow source held every one of them (a 429 past the bound)."""
        self.slots = slots or CopySlots(2, 8, what="{} dataset source operations")
        self.list_timeout_s = list_timeout_s
        """The most a create's listing of a remote source may take (settings dataset_list_timeout_s)."""
        self.run_as = run_as
        self.job_python = job_python
        self.store = store
        self.cache_settings = cache_settings or CacheSettings()
        self._fractions = SharedFractions(self.cache_settings, job_python)
        """CACHED HERE under isolation: one helper per tenant at a time, rerun only on change."""
        self.warmer = engine if isinstance(engine, CacheWarmer) else None
        """The engine, when its nodes' agents can warm their caches (local, Ray)."""
        self.guard = guard or SourceGuard()
        """The admin's policy for sources (default: no local sources, public addresses only)."""
        self._index: Index | None = None

    def _owner(self, caller: Caller, tenant: str | None) -> str:
        owner = tenant or caller.name
        if owner != caller.name and not caller.admin:
            raise Forbidden(f"tenant {caller.name!r} may not manage datasets of tenant {owner!r}")
        return owner

    def create(self, caller: Caller, spec: DatasetSpec, probe: bool = True) -> DatasetRecord:
        """Register a dataset; with `probe`, list its source to check it and learn its size."""
        owner = self._owner(caller, spec.tenant)
        if self.store.get_dataset(owner, spec.name) is not None:
            raise Conflict(f"dataset {spec.name!r} exists for tenant {owner!r}; delete it first")
        rec = DatasetRecord(owner, spec.name, spec.model_copy(update={"tenant": owner}), created_at=time.time())
        if not spec.cache:
            # Every read of a mounted dataset goes through the node cache and `warm` fills it:
            # nothing reads this switch, so it is refused rather than stored and ignored.
            raise SpecError(
                [
                    FieldProblem(
                        "cache",
                        "false is not supported: jobs read every dataset through their node's cache "
                        "(leave cache out, or read the source yourself without mounting it)",
                    )
                ]
            )
        if spec.format != "files":
            raise SpecError(
                [
                    FieldProblem(
                        "format",
                        f"{spec.format!r} is not supported: sluice reads a source as raw files and merges small "
                        "ones into blocks itself (sdk.dataset merge=...); leave format out",
                    )
                ]
            )
        if relative_local_source(spec.source):
            # Relative to what? The plane's working folder means nothing to the caller; the CLI
            # resolves a spec file's relative source against the file's folder, as a job's workdir.
            raise SpecError(
                [
                    FieldProblem(
                        "source",
                        f"local path {spec.source!r} is relative: give an absolute path (a spec file's "
                        "relative path is taken from the file's folder by the CLI)",
                    )
                ]
            )
        try:
            self.guard.check(spec.source, spec.storage_options)
        except SourceRefused as err:
            raise SpecError([FieldProblem(err.field, err.problem)]) from None
        if probe:
            with self.slots.slot(caller.name):  # the caller's request holds the thread
                rec.items, rec.total_bytes = self._probe(spec, owner)
        try:
            self.store.create_dataset(rec)
        except DuplicateError:
            raise Conflict(f"dataset {spec.name!r} exists for tenant {owner!r}") from None
        return rec

    def _probe(self, spec: DatasetSpec, owner: str) -> tuple[int, int]:
        """(items, total bytes) of the source, listed now; SpecError naming the field when it
        cannot be. Under isolation a local source is listed by a helper of the owner's uid, with
        that tenant's own file permissions: the plane is root, and its listing counted the files
        of folders under dataset_roots the tenant may not open (another tenant's), and its
        errors named them."""
        if self.run_as is not None and option_family(spec.source) == "file":
            try:
                items, total = list_as(
                    self.run_as(owner), spec.source, spec.storage_options, self.guard, self.job_python
                )
            except TenantCacheError as err:
                raise SpecError([FieldProblem("source", f"cannot list {spec.source}: {err}")]) from None
            if items == 0:
                raise SpecError([FieldProblem("source", f"{spec.source} holds no files")])
            return items, total
        try:
            source = Source(spec.source, spec.storage_options, retries=1, backoff_s=0.1, guard=self.guard)
            manifest = source.list(timeout_s=self.list_timeout_s)
        except SourceRefused as err:
            raise SpecError([FieldProblem(err.field, err.problem)]) from None
        except SourceError as err:  # names the source and what is wrong with it
            raise SpecError([FieldProblem("source", str(err))]) from None
        except (DataError, OSError, ValueError) as err:
            raise SpecError([FieldProblem("source", f"cannot list {spec.source}: {err}")]) from None
        if len(manifest) == 0:  # a source's own manifest may list nothing
            raise SpecError([FieldProblem("source", f"{spec.source} holds no files")])
        return len(manifest), manifest.total_bytes

    def published(self) -> dict[str, str]:
        """Published dataset name -> owner."""
        return self.store.published_datasets()

    def list_datasets(
        self, caller: Caller, *, after: tuple[str, str] | None = None, limit: int | None = None
    ) -> list[DatasetRecord]:
        """The caller's datasets and the published ones (every tenant's for an admin), in
        (tenant, name) order, strictly after `after`, at most `limit`. A tenant's own and
        published datasets are few, so they are merged and cut here; an admin's list pages
        in the store."""
        if caller.admin:
            return self.store.list_datasets(None, after=after, limit=limit)
        own = self.store.list_datasets(caller.name)
        names = {r.name for r in own}
        for name, owner in sorted(self.published().items()):
            if owner != caller.name and name not in names:
                rec = self.store.get_dataset(owner, name)
                if rec is not None:
                    own.append(rec)
        rows = sorted((r for r in own if after is None or (r.tenant, r.name) > after), key=lambda r: (r.tenant, r.name))
        return rows[:limit] if limit else rows

    def resolve(self, tenant: str, name: str) -> DatasetRecord | None:
        """The dataset `name` as `tenant` sees it: its own, else a published one."""
        rec = self.store.get_dataset(tenant, name)
        if rec is not None:
            return rec
        owner = self.published().get(name)
        return self.store.get_dataset(owner, name) if owner is not None else None

    def get(self, caller: Caller, name: str, tenant: str | None = None) -> DatasetRecord:
        """A dataset the caller may read: its own (an admin: any tenant's with `tenant`), or a
        published one."""
        owner = tenant or caller.name
        if owner != caller.name and not caller.admin:
            owner_pub = self.published().get(name)
            if owner_pub != owner:
                raise NotFound(f"no dataset {name!r}")
        rec = self.resolve(owner, name) if tenant is None else self.store.get_dataset(owner, name)
        if rec is None:
            raise NotFound(f"no dataset {name!r}")
        return rec

    def _owned(self, caller: Caller, name: str, tenant: str | None) -> DatasetRecord:
        """A dataset the caller may change: its own, or (admin) any tenant's."""
        rec = self.get(caller, name, tenant)
        if rec.tenant != caller.name and not caller.admin:
            raise Forbidden(
                f"dataset {name!r} is published by tenant {rec.tenant!r}: you may read and mount it, "
                "not delete or publish it"
            )
        return rec

    def _reader(self, caller: Caller, rec: DatasetRecord) -> str:
        """The tenant whose jobs will read `rec` when `caller` warms or lists it: the caller
        itself (its own dataset, or a published one its jobs mount), or for an admin the owner."""
        return rec.tenant if caller.admin else caller.name

    def delete(self, caller: Caller, name: str, tenant: str | None = None, purge_cache: bool = True) -> dict[str, str]:
        """Unregister the dataset and, with `purge_cache`, drop it from every node's cache
        (through each node's agent): every copy, in the shared cache and in every tenant
        uid's own; per node, what the purge did. Only this dataset's key (`owner/name`) is
        dropped: another tenant's dataset of the same name is untouched."""
        rec = self._owned(caller, name, tenant)
        if self.published().get(rec.name) == rec.tenant:
            self.store.unpublish_dataset(rec.name)
        self.store.delete_dataset(rec.tenant, rec.name)
        if not purge_cache:
            return {}
        key = cache_key(rec.tenant, rec.name)
        owner = self.run_as(rec.tenant) if self.run_as is not None else None
        if self.warmer is not None:
            return self.warmer.drop_dataset(key, owner)
        try:
            removed = drop_everywhere(self.node_cache(), self.cache_settings, key, self.job_python, owner)
        except OSError as err:
            return {socket.gethostname(): f"{type(err).__name__}: {err}"}
        return {socket.gethostname(): "removed" if removed else "not cached"}

    def publish(
        self,
        caller: Caller,
        name: str,
        tenant: str | None = None,
        published: bool = True,
        with_credentials: bool = False,
    ) -> DatasetRecord:
        """Publish (or withdraw) a dataset to every tenant: admin only.

        A job that mounts a dataset gets its storage options (its own misses fetch from the
        source), and every tenant may mount a published one: so a dataset whose options hold
        credentials (CREDENTIAL_OPTIONS, or a password in its source URL) is published only
        `with_credentials`, the admin saying
        they are meant for every tenant (a read-only key made for it); else a Conflict."""
        if not caller.admin:
            raise Forbidden("publishing a dataset to every tenant needs an admin token")
        owner = tenant or caller.name
        rec = self.store.get_dataset(owner, name)
        if rec is None:
            raise NotFound(f"no dataset {name!r} for tenant {owner!r}")
        current = self.published().get(name)
        if not published:
            if current == owner:
                self.store.unpublish_dataset(name)
            return rec
        if current == owner:
            return rec
        if current is not None:
            raise Conflict(f"a dataset named {name!r} is already published by tenant {current!r}; withdraw it first")
        options = sorted(CREDENTIAL_OPTIONS & rec.spec.storage_options.keys())
        secrets = [f"storage options {', '.join(options)}"] if options else []
        if source_has_password(rec.spec.source):  # https://user:pw@host/...: jobs get the URL too
            secrets.append("a password in the source URL")
        endpoint = rec.spec.storage_options.get("endpoint_url")
        if isinstance(endpoint, str) and source_has_password(endpoint):
            secrets.append("a password in storage option endpoint_url")
        if secrets and not with_credentials:
            raise Conflict(
                f"dataset {name!r} of tenant {owner!r} has credentials ({'; '.join(secrets)}): every job "
                "that mounts a published dataset gets its source and storage options, "
                "so publishing it gives them to every tenant's jobs; publish it with --with-credentials "
                "(with_credentials=true) only if they are meant for every tenant (a read-only key made for it)"
            )
        try:
            self.store.publish_dataset(owner, name, time.time())
        except DuplicateError:
            raise Conflict(f"a dataset named {name!r} is already published") from None
        return rec

    def node_cache(self) -> DatasetCache:
        return DatasetCache(self.cache_settings)

    def cached_here(self, caller: Caller, records: Iterable[DatasetRecord]) -> dict[str, float] | None:
        """Cache key (`owner/name`) -> share of each dataset held on this host's node cache, in
        the cache its reader's jobs read (see `_reader`): under isolation that tenant's own,
        read by a helper as its uid; else the shared cache. Only the dataset's current copy
        counts (its source and generation). None when the cache cannot be read."""
        by_reader: dict[str, dict[str, float]] = {}
        out: dict[str, float] = {}
        try:
            for rec in records:
                reader = self._reader(caller, rec) if self.run_as is not None else ""
                held = by_reader.get(reader)
                if held is None:
                    held = by_reader[reader] = (
                        self._fractions.get(self.run_as(reader))
                        if self.run_as is not None
                        else self.node_cache().fractions()
                    )
                out[cache_key(rec.tenant, rec.name)] = held.get(cache_folder(rec), 0.0)
        except OSError:
            return None
        return out

    def cached_bytes_by_tier(self) -> dict[tuple[str, str], int]:
        """(cache key `owner/name`, tier) -> bytes held in this host's node cache (metrics).
        Reads the cache's index only: opening a DatasetCache would resize tiers and start
        writers, which a scrape must never do. Empty until some job has used the cache."""
        if self._index is None:
            path = os.path.join(self.cache_settings.resolved_disk_dir(), "index.sqlite")
            if not os.path.exists(path):
                return {}
            self._index = Index(path, self.cache_settings.lrfu_lambda)
        return self._index.bytes_by_tier()

    def warm(
        self, caller: Caller, name: str, nodes: list[str] | None = None, workers: int = 16, tenant: str | None = None
    ) -> list[WarmReport]:
        """Fetch the whole dataset into the cache of every node (or `nodes`), through each
        node's agent; one report per node. An engine without node agents (the simulator, a
        test's fake) warms the control plane's own node instead. The cache entry warmed is the
        dataset's own (`owner/name`, its current generation): warming never fills another
        tenant's entry. Under isolation the cache filled is the one the reader's jobs read
        (`_reader`: that tenant uid's own), written by a helper running as that uid. One of the
        caller's source-operation slots is held meanwhile (429 when none is free)."""
        rec = self.get(caller, name, tenant)
        with self.slots.slot(caller.name):
            return self._warm(caller, rec, nodes, workers)

    def _warm(self, caller: Caller, rec: DatasetRecord, nodes: list[str] | None, workers: int) -> list[WarmReport]:
        src, opts = rec.spec.source, dict(rec.spec.storage_options)
        key, gen = cache_key(rec.tenant, rec.name), generation(rec)
        user = self.run_as(self._reader(caller, rec)) if self.run_as is not None else None
        if self.warmer is not None:
            try:
                return self.warmer.warm_dataset(key, src, opts, nodes or None, workers, generation=gen, run_as=user)
            except ValueError as err:
                raise SpecError([FieldProblem("nodes", str(err))]) from None
        if nodes:
            raise SpecError(
                [FieldProblem("nodes", "this engine has no node agents to warm; warm without naming nodes")]
            )
        host = socket.gethostname()
        if user is not None:
            return [warm_as(self.cache_settings, user, host, key, src, opts, workers, self.guard, gen, self.job_python)]
        return [warm_node(self.node_cache(), host, key, src, opts, workers, guard=self.guard, generation=gen)]

    # -- what the controller gives jobs and policies ----------------------------------------
    def launch_env(self, tenant: str, names: list[str]) -> dict[str, str]:
        """Environment for a job mounting `names`: where each dataset lives, its cache key
        (`owner/name`) and generation, and where the node cache is (under isolation the agent
        points the job at its uid's own folders inside it). The controller merges it into
        LaunchRequest.env."""
        table: dict[str, Any] = {}
        for n in names:
            rec = self.resolve(tenant, n)
            if rec is not None:
                table[n] = {
                    "source": rec.spec.source,
                    "storage_options": dict(rec.spec.storage_options),
                    "cache_key": cache_key(rec.tenant, rec.name),
                    "generation": generation(rec),
                }
        s = self.cache_settings
        return {
            "SLUICE_DATASETS": json.dumps(table, sort_keys=True),
            "SLUICE_CACHE_DISK_DIR": str(s.resolved_disk_dir()),
            "SLUICE_CACHE_MEMORY_DIR": str(s.resolved_memory_dir()),
        }

    def node_key(self, reader: str, rec: DatasetRecord) -> str:
        """The key under which nodes report the copy of `rec` that `reader`'s jobs read: under
        isolation that tenant uid's own copy (`reader_key`), else the shared cache's
        `owner/name`."""
        if self.run_as is not None:
            return reader_key(self.run_as(reader).uid, cache_folder(rec))
        return cache_key(rec.tenant, rec.name)

    def dataset_bytes(self, tenant: str, names: list[str]) -> dict[str, int]:
        """Sizes for JobView.dataset_bytes (what data-aware placement weighs), keyed like the
        nodes' cache reports of the copy the tenant's jobs read (`node_key`); 0 where the size
        is unknown."""
        out: dict[str, int] = {}
        for n in names:
            rec = self.resolve(tenant, n)
            if rec is not None:
                out[self.node_key(tenant, rec)] = rec.total_bytes or 0
        return out

    def cache_keys(self, tenant: str, names: list[str]) -> list[str]:
        """The cache keys (`owner/name`) of the datasets `names` as `tenant` mounts them: what
        its jobs' cache counters are labelled with."""
        return [cache_key(rec.tenant, rec.name) for n in names if (rec := self.resolve(tenant, n)) is not None]

    def cached_on(
        self, caller: Caller, records: Iterable[DatasetRecord], by_node: Mapping[str, Mapping[str, float]]
    ) -> dict[str, dict[str, float]]:
        """Cache key (`owner/name`) -> node -> share of the dataset in the copy the caller's
        reader's jobs read there (`_reader`, `node_key`), from the nodes' reports `by_node`;
        nodes holding none are left out. Never another tenant's copy."""
        out: dict[str, dict[str, float]] = {}
        for rec in records:
            key = self.node_key(self._reader(caller, rec), rec)
            out[cache_key(rec.tenant, rec.name)] = {
                node: float(held[key]) for node, held in sorted(by_node.items()) if held.get(key, 0.0) > 0
            }
        return out

    def missing(self, tenant: str, names: list[str]) -> list[str]:
        """Datasets a job mounts that its tenant neither registered nor was published."""
        return [n for n in names if self.resolve(tenant, n) is None]
