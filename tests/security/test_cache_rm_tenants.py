"""`dataset rm` of one tenant's dataset never waits on another tenant's cache.

Under isolation `rm` empties every tenant uid's own copy of the dataset, each through a helper
of that uid (a published dataset may be cached by every tenant that read it). Which tenants
hold a copy is read from the names in their cache folders, and each helper works in folders
and an index its tenant's jobs control. So a tenant that made a folder named like another's
dataset (`alice~imgs-0000000000`) and held its own index locked made the owner's `rm` wait for
that helper (60 s: SQLite's busy timeout; a helper its jobs stop with SIGSTOP: the full
DROP_TIMEOUT_S, 600 s) and answer an error naming the other tenant's uid (red team s26).

Now the owner's cache (and the node's shared one) are emptied before `rm` answers, and other
tenants' copies in the background: a re-created dataset is another generation and never reads
them, so what they hold is only room, freed as soon as their helpers get to it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sluice.agent import tenant_cache
from sluice.agent.tenant_cache import tenant_dirs
from sluice.control.datasets import DatasetService, cache_folder
from sluice.data.guard import SourceGuard
from sluice.data.settings import CacheSettings
from sluice.model import JobUser
from sluice.spec import DatasetSpec
from sluice.store.memory import MemoryStore
from tests.isolating import needs_root

ALICE = JobUser(600_021, 600_021)
BOB = JobUser(600_022, 600_022)

BOB_JOB = """
import os, sqlite3, sys, time
os.mkdir(sys.argv[1] + "/alice~imgs-0000000000")
db = sqlite3.connect(sys.argv[1] + "/index.sqlite", isolation_level=None)
db.execute("PRAGMA journal_mode=DELETE"); db.execute("CREATE TABLE t(x)")
db.execute("BEGIN EXCLUSIVE"); db.execute("INSERT INTO t VALUES (1)")
print("locked", flush=True)
time.sleep(120)
"""


@dataclass
class Caller:
    name: str
    admin: bool = False


@needs_root
def test_another_tenants_locked_cache_does_not_hold_up_the_owners_rm(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o711)
    settings = CacheSettings(disk_dir=tmp_path / "cache", memory_dir=tmp_path / "mem", memory_bytes=16 << 20)
    python = os.environ.get("SLUICE_JOB_PYTHON") or sys.executable
    svc = DatasetService(
        MemoryStore(),
        settings,
        guard=SourceGuard.of([tmp_path], []),
        run_as={"alice": ALICE, "bob": BOB}.__getitem__,
        job_python=python,
    )
    src = tmp_path / "src"
    src.mkdir(mode=0o755)
    for i in range(4):
        (src / f"{i}.bin").write_bytes(bytes([i]) * 500)
        (src / f"{i}.bin").chmod(0o644)
    rec = svc.create(Caller("alice"), DatasetSpec(name="imgs", source=str(src)))
    [report] = svc.warm(Caller("alice"), "imgs")
    assert report.error is None and report.files_fetched == 4, report
    bob_disk, _ = tenant_dirs(settings, BOB)
    bob = subprocess.Popen(
        [python, "-c", BOB_JOB, str(bob_disk)],
        user=BOB.uid,
        group=BOB.gid,
        extra_groups=[],
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        assert bob.stdout is not None and bob.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        answer = svc.delete(Caller("alice"), "imgs")
        took = time.monotonic() - t0
        assert took < 10, f"alice's rm waited {took:.0f} s on bob's cache"
        assert answer == {socket.gethostname(): "removed"}, answer
        alice_disk, alice_mem = tenant_dirs(settings, ALICE)
        assert not (alice_disk / cache_folder(rec)).exists() and not (alice_mem / cache_folder(rec)).exists()
    finally:
        bob.kill()
        bob.wait()
    # bob's folder still goes, in the background, once his cache lets it
    assert tenant_cache.background_drops.wait(90)
    assert not (bob_disk / "alice~imgs-0000000000").exists()
