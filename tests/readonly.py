"""A real read-only folder for tests: a tmpfs mounted `ro`.

Tests run as root here, and root writes through `chmod 0500`, so a permission bit proves
nothing; a read-only mount stops root too (EROFS). Mounting needs CAP_SYS_ADMIN: where it is
not allowed the test is skipped, saying so.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def read_only_mount(path: Path) -> Iterator[Path]:
    """`path` (created) with an empty read-only tmpfs mounted on it, unmounted on exit."""
    mount, umount = shutil.which("mount"), shutil.which("umount")
    if mount is None or umount is None:
        pytest.skip("no mount/umount command: cannot make a read-only folder")
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [mount, "-t", "tmpfs", "-o", "ro,size=64k,mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"mounting a read-only tmpfs is not permitted here: {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run([umount, str(path)], capture_output=True, check=False)
