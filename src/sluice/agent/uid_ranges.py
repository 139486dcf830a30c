"""One tenant uid range per live plane on a host: a second plane whose range overlaps is
refused at start.

Why: a tenant's uid is its wall (docs/security.md): files, processes, the network fence's
marks. Each plane hands out uids from `job_uid_min..job_uid_max` in the order its own store
sees tenants, so two planes on one host with the same (default) range hand their first
tenants the same uids — plane A's `alice` and plane B's `bob` would be one user to the
kernel. The setting told operators to pick distinct ranges; nothing checked it.

How: a plane that runs jobs as tenant uids records itself at start in `<RANGES_DIR>/<hash
of its home>.json` (pid and start time, home, the store it hands uids from, its range), under
a host-wide lock, after checking the other records: a live plane (its pid with the same start
time) of another store whose range overlaps refuses the start, naming both. Planes sharing
one store (several planes of one PostgreSQL database) hand out the same uids to the same
tenants and may overlap. Records of planes that are gone are removed. Under /run: they go
with a reboot, as the processes do.

What it does not see: a plane on another host (a Ray cluster's nodes run both planes' jobs),
and a plane that is down while its jobs run on (`sluice down` leaves them running): its
record went with it. docs/security.md, "Deploying it".
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from sluice.agent.shim import process_start_ticks, write_json_atomic

log = logging.getLogger(__name__)

RANGES_DIR = Path("/run/sluice/uid-ranges")
MAX_RECORDS = 4096
"""Most records one check reads (a bound on a directory filled by mistake)."""


class UidRangeInUse(RuntimeError):
    """A live plane of another store on this host hands out overlapping tenant uids."""


@dataclass
class UidRangeClaim:
    """This plane's record (None where none could be written: not root)."""

    path: Path | None

    def release(self) -> None:
        """Remove the record at a clean stop (a killed plane's is removed by the next check)."""
        if self.path is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if json.loads(self.path.read_text()).get("pid") == os.getpid():
                self.path.unlink()


def _alive(record: dict[str, object]) -> bool:
    pid, start = record.get("pid"), record.get("start")
    return isinstance(pid, int) and isinstance(start, int) and process_start_ticks(pid) == start


def store_of(db_url: str) -> str:
    """The store a plane hands uids from, as records compare it: its URL without the password,
    and an SQLite file by its absolute path. Two planes whose homes were given relative
    (`SLUICE_HOME=h`) from different folders have URLs that read alike (`sqlite:///h/sluice.db`)
    but two databases: compared as written, they passed as one store and so could share a range
    (red team s22)."""
    from sqlalchemy.engine import make_url

    url = make_url(db_url)
    path = url.database if url.get_backend_name() == "sqlite" else None
    if path and path != ":memory:" and not path.startswith("file:"):
        url = url.set(database=str(Path(path).resolve()))
    return url.render_as_string(hide_password=True)


def claim_uid_range(
    home: Path,
    store: str,
    lowest: int,
    highest: int,
    directory: Path = RANGES_DIR,
    held: tuple[int, int] | None = None,
) -> UidRangeClaim:
    """Record that the plane of `home`, handing uids from `store`, uses `lowest..highest`
    and `held`, the uids its tenants already run as (given under an earlier range, they may
    lie outside it: a plane whose range was moved ran its old tenants as uids inside another
    live plane's range, unchecked); UidRangeInUse where a live plane of another store here
    overlaps what it uses."""
    setting = f"{lowest}..{highest} (settings job_uid_min/job_uid_max)"
    if held is not None and (held[0] < lowest or held[1] > highest):
        setting = (
            f"{min(lowest, held[0])}..{max(highest, held[1])} (settings job_uid_min/job_uid_max {lowest}..{highest}, "
            f"and {held[0]}..{held[1]} that its tenants already run as, given under an earlier range)"
        )
        lowest, highest = min(lowest, held[0]), max(highest, held[1])
        advice = "; its tenants keep the uids they were given, so the other plane needs a range apart from those"
    else:
        advice = ""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock_fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        log.warning("tenant uid ranges of other planes on this host not checked: %s: %s", directory, err.strerror)
        return UidRangeClaim(None)
    home_key = str(home.resolve())
    mine = directory / f"{hashlib.sha256(home_key.encode()).hexdigest()[:16]}.json"
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        for n, path in enumerate(sorted(directory.glob("*.json"))):
            if n >= MAX_RECORDS:
                break
            try:
                if path.is_symlink():
                    continue
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(record, dict):
                continue
            if not _alive(record):
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            if path == mine or record.get("store") == store:
                continue
            lo, hi = record.get("lowest"), record.get("highest")
            if isinstance(lo, int) and isinstance(hi, int) and lo <= highest and lowest <= hi:
                raise UidRangeInUse(
                    f"tenant uid range {setting} overlaps "
                    f"{lo}..{hi} of the plane of {record.get('home')} (pid {record.get('pid')}) on this host: "
                    "the two planes would run different tenants' jobs as the same uid. Give this plane a range "
                    f"of its own (SLUICE_JOB_UID_MIN / SLUICE_JOB_UID_MAX){advice}"
                )
        write_json_atomic(
            mine,
            {
                "pid": os.getpid(),
                "start": process_start_ticks(os.getpid()),
                "home": home_key,
                "store": store,
                "lowest": lowest,
                "highest": highest,
            },
        )
        return UidRangeClaim(mine)
    finally:
        os.close(lock_fd)
