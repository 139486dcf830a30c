"""The node cache's shared tiers are the plane's alone once an agent has claimed them.

A cache filled before isolation was on (or by a plane without it) was made with the plane's
umask: tier folders 0755, the index and every memory-tier item 0644. Turning isolation on made
$SLUICE_HOME 0711 and left those as they were, and an agent accepted such a tier (it checks
only that nobody else may *write* it): every tenant's job could list `$SLUICE_HOME/cache`, read
its index (every dataset's name and source) and read every item cached in
`/dev/shm/sluice-<hash>/` — another tenant's data (red team s26; the memory tier also to every
user of the host, isolation or not). Now claiming the tiers makes each 0711 (tenants pass
through to their own `uid-<uid>` folder by name) and everything else in it 0700/0600.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sluice.agent.tenant_cache import claim_tiers, tenant_dir
from sluice.data.cache import TENANT_DIR, DatasetCache
from sluice.data.settings import CacheSettings
from sluice.model import JobUser


def test_claiming_the_tiers_closes_what_an_earlier_plane_left_open(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.bin").write_bytes(bytes([i]) * 100)
    settings = CacheSettings(disk_dir=tmp_path / "home" / "cache", memory_dir=tmp_path / "mem", memory_bytes=1 << 20)
    old = os.umask(0o022)
    try:
        cache = DatasetCache(settings)  # a plane without isolation, as jobs fill it
        ds = cache.open("alice/secret", str(src), generation="g1")
        for i in range(len(ds)):
            ds.read(i)
        cache.drain()
    finally:
        os.umask(old)
    me = JobUser(os.geteuid(), os.getegid())
    assert claim_tiers(settings) == []
    for base in (settings.resolved_disk_dir(), settings.resolved_memory_dir()):
        tenant_dir(base, me)  # a tenant's own folder stays the tenant's
        assert stat.S_IMODE(os.lstat(base).st_mode) == 0o711, base
        for entry in os.scandir(base):
            mode = stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode)
            if TENANT_DIR.fullmatch(entry.name):
                assert mode == 0o700
                continue
            assert mode & 0o077 == 0, f"{entry.path} is {mode:o}"
    # the plane (this uid) still reads what it cached
    again = DatasetCache(settings).open("alice/secret", str(src), generation="g1")
    assert [again.read(i) for i in range(len(again))] == [bytes([i]) * 100 for i in range(3)]
    assert again.counters.misses == 0
