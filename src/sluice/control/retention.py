"""Job retention: an ended job is forgotten `job_retention_days` after it finished.

Every job leaves a record, an event log and a run folder (its log, and its checkpoints unless
it put them elsewhere). Kept for ever they grow without bound — each tenant's submissions
add to the database and the disk every day, and every listing reads past them — so, as
Kubernetes' `ttlSecondsAfterFinished` and Slurm's purge do, the plane forgets an ended job
once its time is up: its record and events in one transaction, then its folders; node
events (health, cordons) older than the same window go too. Two kinds of job are kept past
their time, because forgetting them would change what a live job does:

- a job that a job not yet ended starts after (`after`; a job array named there keeps every
  job of it): a predecessor that is gone reads as "ended and is gone", which cancels;
- a job of an array whose other jobs have not all ended before the cutoff: an array is
  found by its first job (`<id>-0`), so it goes whole or not at all.

Usage's held time (by tenant and hour: what `sluice usage` sums) outlives the jobs — it is
what a tenant is charged, and deleting jobs must not hide it — and goes after its own window,
`usage_retention_days` (default 400: a year and its month, for year-on-year reports).

A pass runs in a thread of its own (`RetentionThread`), hourly, and looks at a bounded
number of candidates (the next pass goes on after the last one it looked at); the
controller's lock is held only while it chooses and deletes a batch, never while folders
are removed. What a pass did is one event of no job (`kind` "retention") and a log line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from sluice.model import JobRecord
from sluice.store import Store
from sluice.store.base import StoreUnavailable

log = logging.getLogger(__name__)

DAY_S = 86_400.0
BATCH = 500
"""Candidates read, and jobs deleted, per transaction."""
MOST_PER_PASS = 10_000
"""Candidates one pass looks at; the rest wait for the next pass (which then comes soon)."""
EVERY_S = 3_600.0
"""Seconds between passes while nothing is left over."""
SOON_S = 60.0
"""Seconds to the next pass when one stopped at MOST_PER_PASS."""


@dataclass(frozen=True)
class RetentionPass:
    """What one pass did: jobs forgotten, events of no job deleted, folders removed, and
    ended jobs past their time that were kept (waited for, or in an unfinished array)."""

    cutoff: float
    jobs: int = 0
    events: int = 0
    folders: int = 0
    kept: int = 0
    more: bool = False
    """The pass stopped at its bound with candidates left."""
    held_rows: int = 0
    """Rows of usage's held time (tenant, hour, kind) past `usage_retention_days` deleted."""

    def summary(self) -> str:
        when = datetime.fromtimestamp(self.cutoff, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        said = []
        if self.jobs or self.events or self.folders or self.kept:
            said.append(
                f"forgot {self.jobs} jobs that ended before {when} and {self.events} older events of no job; "
                f"removed {self.folders} run folders"
            )
        if self.kept:
            said.append(f"kept {self.kept} (waited for by a live job, or in an array not all ended)")
        if self.held_rows:
            said.append(f"deleted {self.held_rows} rows of held time past the usage window")
        return "; ".join(said) or "nothing to forget"


def forgettable(
    candidates: Iterable[JobRecord],
    live: Iterable[JobRecord],
    cutoff: float,
    get: Callable[[str], JobRecord | None],
    arrays: set[str] | None = None,
) -> tuple[list[str], int]:
    """Of the ended `candidates` (each finished before `cutoff`), the ids to forget, and how
    many jobs and arrays were kept: none that a `live` job starts after, arrays only whole
    (every job of one ended before `cutoff`; read through `get`). `arrays`: the ids of the
    arrays already decided in this pass (each is judged once; updated)."""
    live = list(live)
    waited_for = {dep for job in live for dep in job.spec.predecessors}
    live_ids = {job.id for job in live}
    out: list[str] = []
    kept = 0
    arrays = set() if arrays is None else arrays
    for job in candidates:
        a = job.spec.array
        if a is None or a.id is None:
            if job.id in waited_for:
                kept += 1
            else:
                out.append(job.id)
            continue
        if a.id in arrays:
            continue  # decided with an earlier job of it
        arrays.add(a.id)
        ids = [f"{a.id}-{k}" for k in range(a.count)]
        # A job of it not ended (the book has every live one), or waited for, keeps it: no
        # record is read. Else its jobs are read until the first that keeps it (reading the
        # whole array, under the controller's lock, pass after pass, cost a tenant's arrays
        # with one job left running a thousand reads each).
        whole = a.id not in waited_for and not any(i in live_ids or i in waited_for for i in ids)
        members: list[JobRecord] = []
        for i in ids if whole else ():
            m = get(i)
            if m is None:
                continue
            ended = m.phase.terminal and m.finished_at is not None and m.finished_at < cutoff
            if m.tenant != job.tenant or not ended:
                whole = False
                break
            members.append(m)
        if whole:
            out.extend(m.id for m in members)
        else:
            kept += 1
    return list(dict.fromkeys(out)), kept


class Retention:
    """Forgets ended jobs past `keep_s`, and usage's held time past `usage_keep_s` (see the
    module's docstring; 0 keeps that kind for ever). `lock` is the controller's: held while a
    batch is chosen against the live jobs and deleted, so a job submitted to start `after` one
    cannot see it vanish between its check and its creation."""

    def __init__(
        self,
        store: Store,
        keep_s: float,
        *,
        live: Callable[[], list[JobRecord]],
        get: Callable[[str], JobRecord | None],
        lock: threading.RLock | threading.Lock,
        remove_folders: Callable[[str], int] | None = None,
        forgot: Callable[[], None] | None = None,
        halted: Callable[[], bool] = lambda: False,
        most_per_pass: int = MOST_PER_PASS,
        batch: int = BATCH,
        usage_keep_s: float = 0.0,
    ) -> None:
        if keep_s < 0 or usage_keep_s < 0 or not (keep_s or usage_keep_s):
            raise ValueError("keep_s or usage_keep_s must be positive, neither negative (0: keep that kind)")
        self.store = store
        self.keep_s = keep_s
        self.usage_keep_s = usage_keep_s
        self._live = live
        self._get = get
        self._lock = lock
        self._remove_folders = remove_folders
        self._forgot = forgot
        """Told (under the lock) after a batch of jobs was forgotten: what they held is gone."""
        self._halted = halted
        """True once the plane no longer acts on its jobs (another plane took its database):
        its book is stale then, and the jobs are the other plane's to forget."""
        self.most_per_pass = most_per_pass
        self.batch = batch
        self._resume: tuple[float, str] | None = None
        """The candidate key a pass stopped at its bound after: the next goes on from there (begun
        again at the earliest, a bound's worth of kept jobs hid every later one for ever)."""

    def run(self, now: float) -> RetentionPass:
        cutoff = now - self.keep_s
        seen = jobs = folders = kept = events = 0
        after = self._resume
        arrays: set[str] = set()
        more = False
        while self.keep_s:
            if seen >= self.most_per_pass:
                more = True
                self._resume = after
                break
            with self._lock:
                if self._halted():
                    break
                page = self.store.ended_before(cutoff, min(self.batch, self.most_per_pass - seen), after=after)
                if not page:
                    self._resume = None  # the end: the next pass begins at the earliest again
                    break
                seen += len(page)
                after = (page[-1].finished_at or 0.0, page[-1].id)
                ids, k = forgettable(page, self._live(), cutoff, self._get, arrays)
                kept += k
                gone = self.store.delete_jobs(ids) if ids else 0
                if gone and self._forgot is not None:
                    self._forgot()
            jobs += gone
            if self._remove_folders is not None:
                for job_id in ids:
                    try:
                        folders += self._remove_folders(job_id)
                    except Exception:  # one folder's trouble must not keep the others
                        log.exception("could not remove the run folders of forgotten job %s", job_id)
        while self.keep_s and not self._halted():
            if events >= self.most_per_pass:
                more = True
                break
            n = self.store.delete_events_before(cutoff, self.batch)
            events += n
            if n < self.batch:
                break
        held = 0
        while self.usage_keep_s and not self._halted():
            if held >= self.most_per_pass:
                more = True
                break
            n = self.store.delete_held_time_before(now - self.usage_keep_s, self.batch)
            held += n
            if n < self.batch:
                break
        done = RetentionPass(cutoff, jobs, events, folders, kept, more, held)
        if jobs or events or held:
            data = {"jobs": jobs, "events": events, "held_rows": held}
            self.store.append_event(now, "retention", done.summary(), data=data)
            log.info("retention: %s", done.summary())
        return done


class RetentionThread:
    """Runs `Retention` passes in the background: the first soon after start, then every
    EVERY_S (SOON_S after a pass that stopped at its bound, or one the store refused)."""

    def __init__(self, retention: Retention, clock: Callable[[], float] = time.time) -> None:
        self.retention = retention
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last: RetentionPass | None = None

    def start(self, first_after_s: float = SOON_S) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(first_after_s,), name="sluice-retention", daemon=True)
        self._thread.start()

    def _loop(self, wait: float) -> None:
        while not self._stop.wait(wait):
            try:
                self.last = self.retention.run(self._clock())
                wait = SOON_S if self.last.more else EVERY_S
            except StoreUnavailable as err:
                log.warning("retention pass put off: %s", err)
                wait = SOON_S
            except Exception:
                log.exception("retention pass failed")
                wait = EVERY_S

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
