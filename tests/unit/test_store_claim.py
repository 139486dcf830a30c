"""One database serves one control plane: a second plane on it (another home, the same
db_url) would take the first's running jobs for gone and run them again (walkthrough 4, on
PostgreSQL; SQLite likewise). `SqlStore.claim` holds the database until the store closes or
the process ends; PostgreSQL's advisory lock is tested in tests/integration/test_postgres_store.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.store import StoreInUse
from sluice.store.sql import SqlStore


def test_a_second_plane_on_one_sqlite_database_is_refused_until_the_first_lets_go(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sluice.db'}"
    first, second = SqlStore(url), SqlStore(url)
    first.claim()
    first.claim()  # idempotent
    with pytest.raises(StoreInUse, match=f"pid {os.getpid()}.*one database serves one plane"):
        second.claim()
    first.close()
    second.claim()
    second.close()
    assert oct((tmp_path / "sluice.db.plane-lock").stat().st_mode & 0o777) == "0o600"


def test_a_plane_killed_with_its_claim_leaves_the_database_free(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sluice.db'}"
    SqlStore(url).close()  # the schema, made once
    code = f"from sluice.store.sql import SqlStore; import os; SqlStore({url!r}).claim(); os.kill(os.getpid(), 9)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == -9
    store = SqlStore(url)
    store.claim()  # the kernel dropped the dead process's lock
    store.close()
