"""The job book: the one book of record for jobs, and the only writer of job state.

Why one writer: a job's phase decides what runs, and every path that changes it (the round,
a user's cancel, crash recovery, node loss) must agree on what is legal and leave the same
trace. So every change goes through `transition`:

1. it checks the move against the phase table (`model.phase.TRANSITIONS`) and *raises*
   `IllegalTransition` on an illegal one — nothing is silently ignored;
2. it builds the new (immutable) record and the event that explains it;
3. it writes both to the store in one transaction;
4. only then does the in-memory record change.

So a failed write (disk full, read-only home: `StoreUnavailable`) leaves memory and disk
agreeing on the old state, and a crash between any two steps (see `failpoints`) loses no
acknowledged change: what was acknowledged was on disk first.

Progress (step, loss, attained service, newest checkpoint) changes many times a second over
thousands of jobs. It is `observe`d into memory and written with the next transition or by
`flush` at most every `save_progress_every_s`; losing a few seconds of it in a crash costs
nothing, because the agent re-reports it.

Reads (`get`, `live`, `list`, `events`) are what the API, CLI, metrics, health and
benchmarks use; they return immutable records, never something to edit.
"""

from __future__ import annotations

import heapq
import logging
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from sluice.control.failpoints import Failpoints
from sluice.model import IllegalTransition, JobRecord, Phase, can_transition
from sluice.spec import JobSpec
from sluice.spec.job import JOB_ID_PATTERN
from sluice.store.base import EventRecord, NewEvent, Store, StoreUnavailable

log = logging.getLogger("sluice.book")

LIVE_PHASES = tuple(p for p in Phase if not p.terminal)

OBSERVED_FIELDS = frozenset(
    {
        "step",
        "loss",
        "attained_service",
        "run_s",
        "run_until",
        "cpu_used_s",
        "attempt_cpu_s",
        "disk_mb",
        "checkpoint",
        "checkpoint_step",
    }
)
"""Fields `observe` may change without a transition: facts reported by the job, not decisions."""


class UnknownJob(KeyError):
    """No live job by that id in the book."""


_JOB_ID = re.compile(JOB_ID_PATTERN)


def _job_key(job: JobRecord) -> tuple[float, str]:
    return (job.submitted_at, job.id)


class JobBook:
    def __init__(
        self,
        store: Store,
        clock: Callable[[], float],
        *,
        failpoints: Failpoints | None = None,
        save_progress_every_s: float = 5.0,
        record_waits: bool = True,
    ) -> None:
        """`record_waits=False` keeps wait reasons in the record only, not in the event log
        (the simulator: millions of them buy nothing there)."""
        self._store = store
        self._clock = clock
        self.failpoints = failpoints or Failpoints()
        self.save_progress_every_s = save_progress_every_s
        self.record_waits = record_waits
        self._live: dict[str, JobRecord] = {}
        self.ended_disk_mb: dict[str, float] = {}
        """Per tenant, the MiB (`disk_mb`) of the jobs this book has ended, summed: a reader of
        what ended jobs hold (a tenant's disk use, `Controller._ended_disk_mb`) adds what ended
        since it read the store, instead of reading it again."""
        self._observed: set[str] = set()
        self._last_saved: dict[str, float] = {}

    # ------------------------------------------------------------------ reads

    def get(self, job_id: str) -> JobRecord | None:
        """The newest record of a job, live or finished (None if it never existed). A name
        no job id can have (JOB_ID_PATTERN) is none without asking the store: a path segment
        with a NUL (`%00`) made PostgreSQL's driver raise, a 500 (red team s28)."""
        job = self._live.get(job_id)
        if job is not None:
            return job
        return self._store.get_job(job_id) if _JOB_ID.fullmatch(job_id) else None

    def live(self) -> list[JobRecord]:
        """Every non-terminal job, oldest submission first."""
        return sorted(self._live.values(), key=lambda j: (j.submitted_at, j.id))

    def live_ids(self) -> list[str]:
        return list(self._live)

    def live_count(self, tenant: str) -> int:
        """How many of the tenant's jobs have not ended."""
        return sum(1 for j in self._live.values() if j.tenant == tenant)

    def is_live(self, job_id: str) -> bool:
        return job_id in self._live

    def revert_to_stored(self, job_id: str) -> bool:
        """Drop a live job's observations not yet written, taking back the record the store
        last took (False when it has none, or the job is not live). For a record the store
        refuses for what a report put in it: the transition that fails the job writes that
        record too, and was refused the same way, so the job stayed live (sdkwalk s32)."""
        stored = self._store.get_job(job_id) if job_id in self._live else None
        if stored is None:
            return False
        self._live[job_id] = stored
        self._observed.discard(job_id)
        return True

    def query(
        self,
        tenant: str | None = None,
        phases: Iterable[Phase] | None = None,
        *,
        after: tuple[float, str] | None = None,
        limit: int | None = None,
    ) -> list[JobRecord]:
        """Jobs of a tenant (None: all) in the given phases, with live jobs as the book has
        them now (newer than the store by up to one progress flush), in (submitted_at, id)
        order, strictly after `after`, at most `limit`; fewer than `limit` means no more.

        Two sources, each read in key order and merged: the store for ended jobs (a job is in
        the book's live set exactly while its stored phase has not ended: both change in one
        write), the book for live ones. The store was read for every phase, skipping the live
        rows it returned, so a tenant with 10,000 queued jobs cost a read of all of them for
        each page of 50 (about 1 s a page at 4,000)."""
        ph = set(phases) if phases is not None else None
        ended = {p for p in Phase if p.terminal}
        stored_phases = ended if ph is None else ph & ended
        out: dict[str, JobRecord] = {}
        if stored_phases:
            for j in self._store.list_jobs(tenant=tenant, phases=stored_phases, limit=limit, after=after):
                out[j.id] = j
        live = [
            j
            for j in self._live.values()
            if (tenant is None or j.tenant == tenant)
            and (ph is None or j.phase in ph)
            and (after is None or (j.submitted_at, j.id) > after)
        ]
        key = _job_key
        for j in heapq.nsmallest(limit, live, key=key) if limit else live:
            out[j.id] = j  # the book's copy is the newer
        jobs = sorted(out.values(), key=key)
        return jobs[:limit] if limit else jobs

    def events(self, job_id: str, skip: int = 0, limit: int | None = None) -> list[EventRecord]:
        """The job's history, oldest first: what `sluice job why` prints (a page of it: the
        job's events past its first `skip`, at most `limit`). Paged by the job's own count,
        not the store's sequence numbers: those count every tenant's events, so a tenant
        comparing two of its own would learn how busy the others were."""
        if not _JOB_ID.fullmatch(job_id):
            return []
        return self._store.events(job_id=job_id, offset=max(0, skip), limit=limit)

    # ------------------------------------------------------------------ writes

    def create(self, tenant: str, spec: JobSpec, *, job_id: str | None = None) -> JobRecord:
        """Accept a job: on disk, with its first event, before this returns."""
        now = self._clock()
        job = JobRecord(
            id=job_id or f"j-{uuid.uuid4().hex[:10]}",
            tenant=tenant,
            spec=spec,
            phase=Phase.PENDING,
            reason="accepted; waiting for admission",
            submitted_at=now,
        )
        event = NewEvent(now, "phase", f"{Phase.PENDING}: submitted by tenant {tenant}", job_id=job.id)
        self.failpoints.hit("book.create.before_write")
        self._store.create_job(job, [event])
        self.failpoints.hit("book.create.after_write")
        self._live[job.id] = job
        self._last_saved[job.id] = now
        return job

    def create_many(self, tenant: str, specs: Sequence[tuple[JobSpec, str]]) -> list[JobRecord]:
        """Accept several jobs (spec, id) at once, as `create` does one: all on disk in one
        transaction before this returns, or none (a crash or a failed write halfway through a
        job array left the jobs before it, which then ran)."""
        now = self._clock()
        made = [
            JobRecord(
                id=job_id,
                tenant=tenant,
                spec=spec,
                phase=Phase.PENDING,
                reason="accepted; waiting for admission",
                submitted_at=now,
            )
            for spec, job_id in specs
        ]
        rows = [
            (j, [NewEvent(now, "phase", f"{Phase.PENDING}: submitted by tenant {tenant}", job_id=j.id)]) for j in made
        ]
        self.failpoints.hit("book.create.before_write")
        self._store.create_jobs(rows)
        self.failpoints.hit("book.create.after_write")
        for job in made:
            self._live[job.id] = job
            self._last_saved[job.id] = now
        return made

    def transition(
        self,
        job_id: str,
        dst: Phase,
        reason: str,
        *,
        events: Sequence[tuple[str, str, dict[str, Any] | None]] = (),
        **changes: Any,
    ) -> JobRecord:
        """Move a live job to `dst` with `reason`, changing `changes` fields with it, and
        write the record with a phase event (plus `events`: (kind, message, data)) in one
        transaction. Raises IllegalTransition for a move the table forbids, UnknownJob for
        a job that is not live (finished jobs never move again)."""
        job = self._require(job_id)
        src = job.phase
        if dst != src and not can_transition(src, dst):
            raise IllegalTransition(src, dst)
        now = self._clock()
        if dst.terminal:
            changes.setdefault("finished_at", now)
            changes["stop_intent"] = None
        if dst == Phase.STARTING and src != Phase.STARTING:
            changes.setdefault("run_until", now)  # a new attempt's run time counts from here
            changes.setdefault("attempt_cpu_s", 0.0)  # and its node's CPU counter from 0
        new = replace(job, phase=dst, reason=reason, **changes)
        drafts = []
        if dst != src:
            drafts.append(
                NewEvent(now, "phase", f"{src} -> {dst}: {reason}", job_id=job_id, data={"from": src, "to": dst})
            )
        drafts.extend(NewEvent(now, kind, msg, job_id=job_id, data=data or {}) for kind, msg, data in events)
        self._write(new, drafts, "transition")
        if dst.terminal and new.disk_mb:
            self.ended_disk_mb[new.tenant] = self.ended_disk_mb.get(new.tenant, 0.0) + new.disk_mb
        return new

    def update(
        self, job_id: str, kind: str, message: str, data: dict[str, Any] | None = None, **changes: Any
    ) -> JobRecord:
        """Change fields of a live job without a phase move (a resize, a stop intent, a wait
        reason), written with the event that explains it."""
        job = self._require(job_id)
        new = replace(job, **changes)
        self._write(new, [NewEvent(self._clock(), kind, message, job_id=job_id, data=data or {})], "transition")
        return new

    def wait(self, job_id: str, reason: str) -> JobRecord:
        """A queued or pending job's reason for waiting. Written (with an event when
        `record_waits`) only when it changed, so a job waiting for hours logs one line."""
        job = self._require(job_id)
        if job.reason == reason:
            return job
        if self.record_waits:
            return self.update(job_id, "wait", reason, reason=reason)
        new = replace(job, reason=reason)
        self._live[job_id] = new
        self._observed.add(job_id)
        return new

    def note(self, job_id: str, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        """An event about a job that changes nothing in its record (a refused decision)."""
        self._store.append_event(self._clock(), kind, message, job_id=job_id, data=data)

    def observe(self, job_id: str, **changes: Any) -> JobRecord | None:
        """Facts the job reported (progress, its newest checkpoint, service received): kept in
        memory now, written with the next transition or flush. Ignored for a job that is no
        longer live: a late report never touches a finished job."""
        bad = set(changes) - OBSERVED_FIELDS
        if bad:
            raise ValueError(f"observe: {sorted(bad)} are decisions, not observations; use transition or update")
        job = self._live.get(job_id)
        if job is None:
            return None
        new = replace(job, **changes)
        self._live[job_id] = new
        self._observed.add(job_id)
        return new

    def flush(self, *, force: bool = False) -> None:
        """Write observed changes that are older than `save_progress_every_s` (all with force)."""
        if not self._observed:
            return
        now = self._clock()
        for jid in list(self._observed):
            job = self._live.get(jid)
            if job is None:
                self._observed.discard(jid)
                continue
            if force or now - self._last_saved.get(jid, 0.0) >= self.save_progress_every_s:
                self.failpoints.hit("book.flush.before_write")
                try:
                    self._store.save_job(job)
                except StoreUnavailable:
                    raise
                except Exception:
                    # One job's record the store refuses must not stop every other job's
                    # progress (nor the round): it is tried again at the next interval.
                    log.exception("could not save the progress of job %s", jid)
                    self._last_saved[jid] = now
                    continue
                self.failpoints.hit("book.flush.after_write")
                self._last_saved[jid] = now
                self._observed.discard(jid)

    # ------------------------------------------------------------------ recovery

    def load_live(self) -> list[JobRecord]:
        """Read every non-terminal job from the store (a control plane starting up)."""
        for job in self._store.list_jobs(phases=LIVE_PHASES):
            self._live[job.id] = job
            self._last_saved[job.id] = self._clock()
        return self.live()

    def adopt(self, job: JobRecord) -> None:
        """Take a live job read from the store into the book (a cancel of a job this process
        had not loaded yet). Terminal jobs are not taken: they never change again."""
        if not job.phase.terminal and job.id not in self._live:
            self._live[job.id] = job

    # ------------------------------------------------------------------ internals

    def _require(self, job_id: str) -> JobRecord:
        job = self._live.get(job_id)
        if job is None:
            stored = self._store.get_job(job_id)
            if stored is not None and stored.phase.terminal:
                raise IllegalTransition(stored.phase, stored.phase)
            raise UnknownJob(job_id)
        return job

    def _write(self, new: JobRecord, drafts: list[NewEvent], point: str) -> None:
        self.failpoints.hit(f"book.{point}.before_write")
        self._store.save_job(new, drafts)
        self.failpoints.hit(f"book.{point}.after_write")
        now = self._clock()
        self._last_saved[new.id] = now
        self._observed.discard(new.id)
        if new.phase.terminal:
            self._live.pop(new.id, None)
            self._last_saved.pop(new.id, None)
        else:
            self._live[new.id] = new


__all__ = ["LIVE_PHASES", "JobBook", "UnknownJob"]
