"""Typed knobs of the node cache and the readers (SLUICE_CACHE_* environment variables)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Annotated

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _home() -> Path:
    """$SLUICE_HOME as `sluice.settings.Settings.home` reads it, for a process that has only its
    environment (a job, a bench, the SDK off-cluster)."""
    return Path(os.environ.get("SLUICE_HOME") or Path.home() / ".sluice")


class CacheSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SLUICE_CACHE_", extra="ignore")

    disk_dir: Annotated[
        Path | None, Field(description="Disk tier and the cache index. Default $SLUICE_HOME/cache.")
    ] = None
    memory_dir: Annotated[
        Path | None,
        Field(
            description="Memory tier on tmpfs, shared by every job of the node. Default /dev/shm/sluice-<home hash>."
        ),
    ] = None
    memory_bytes: Annotated[
        int | None, Field(ge=0, description="Memory tier capacity in bytes. Default: elastic, up to 25 % of RAM.")
    ] = None
    disk_bytes: Annotated[int, Field(ge=0, description="Disk tier capacity in bytes. Default 20 GiB.")] = 20 * 1024**3
    memory_watermark: Annotated[
        float, Field(gt=0, le=1, description="Node memory use above which prefetch and the memory tier stop growing.")
    ] = 0.90
    lrfu_lambda: Annotated[
        float, Field(ge=0, le=1, description="LRFU decay per second: 0 = pure frequency, 1 = nearly pure recency.")
    ] = 0.01
    retries: Annotated[int, Field(ge=0, le=20, description="Retries of a failed source read. Default 3.")] = 3
    retry_backoff_s: Annotated[float, Field(ge=0, description="First retry back-off in seconds; doubles.")] = 0.2
    prefetch_workers_per_cpu: Annotated[
        int,
        Field(ge=1, le=64, description="Fetch threads per CPU at most; fetches wait on I/O, not CPU. Default 8."),
    ] = 8
    small_file_bytes: Annotated[
        int, Field(ge=1, description="Files below this size are candidates for merging into blocks. Default 1 MiB.")
    ] = 1024 * 1024
    block_bytes: Annotated[
        int, Field(ge=4096, description="Target size of a merged block in bytes. Default 4 MiB.")
    ] = 4 * 1024 * 1024
    stall_threshold: Annotated[
        float, Field(ge=0, le=1, description="Stall fraction above which merging is tried. Default 0.05.")
    ] = 0.05
    warm_timeout_s: Annotated[
        float,
        Field(
            gt=0,
            le=7 * 86400,
            description="Seconds a `dataset warm` into a tenant's own cache (a helper of the tenant's uid) may "
            "take before the helper is killed and the warm fails, saying so. The warm holds one of its tenant's "
            "and one of the plane's few source slots (dataset_source_ops) while it runs, and a source that "
            "answers slowly or never is the tenant's choice. Default 3600.",
        ),
    ] = 3600.0
    stats_flush_s: Annotated[
        float, Field(gt=0, description="Seconds between flushes of access statistics to the index. Default 5.")
    ] = 5.0

    @classmethod
    def for_home(cls, home: Path) -> CacheSettings:
        """The cache of the node whose state folder is `home`, both folders filled in.

        The control plane and its agents get it from `Settings.cache` (their own home); jobs
        get the same folders through their environment (SLUICE_CACHE_DISK_DIR/MEMORY_DIR)."""
        base = cls()
        disk, memory = cache_dirs(home, base.disk_dir, base.memory_dir)
        return base.model_copy(update={"disk_dir": disk, "memory_dir": memory})

    def resolved_disk_dir(self) -> Path:
        return cache_dirs(_home(), self.disk_dir, self.memory_dir)[0]

    def resolved_memory_dir(self) -> Path:
        return cache_dirs(_home(), self.disk_dir, self.memory_dir)[1]


def cache_dirs(home: Path, disk_dir: Path | None = None, memory_dir: Path | None = None) -> tuple[Path, Path]:
    """Where a node's dataset cache lives: the one rule, every default derives from it.

    The disk tier (and the index) go to `home/cache`; the memory tier to one tmpfs folder per
    sluice home (`/dev/shm/sluice-<hash of home>`), so two homes on one machine never share a
    cache. A folder set explicitly (SLUICE_CACHE_DISK_DIR / SLUICE_CACHE_MEMORY_DIR) wins."""
    disk = disk_dir or home / "cache"
    if memory_dir is not None:
        return disk, memory_dir
    tag = hashlib.sha1(str(home.resolve()).encode()).hexdigest()[:10]
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else disk
    return disk, base / f"sluice-{tag}"
